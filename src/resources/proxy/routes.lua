-- Written by memcached-operator's agent, loaded with memcached's route library in every worker:
-- the operator's own route handlers.

-- A queue handle for each of `children`, in their order.
local function handles_of(fgen, children)
    local handles = {}
    for _, child in pairs(children) do
        table.insert(handles, fgen:new_handle(child))
    end
    return handles
end

-- route_hold: while the operator updates the members, a request its child could not get an
-- answer for (a member restarting: the connection refused or dropped) is sent again every
-- `pause` seconds, `tries` times in all, so that the client waits for the member instead of
-- being told SERVER_ERROR. A member's own answers, misses and errors included, are returned as
-- they are. Each try needs a queue handle of its own: a handle is waited on once a request.
register_route_handlers({ "hold" })

function route_hold_conf(t, ctx)
    return t
end

local function route_hold_f(rctx, a)
    local handles, pause = a.handles, a.pause
    return function(r)
        local res = nil
        for i = 1, #handles do
            if i > 1 then
                rctx:sleep(pause)
            end
            res = rctx:enqueue_and_wait(r, handles[i])
            if res ~= nil and res:ok() then
                return res
            end
        end
        return res
    end
end

function route_hold_start(a, ctx, fgen)
    local handles = {}
    for i = 1, a.tries do
        handles[i] = fgen:new_handle(a.child)
    end
    fgen:ready({ a = { handles = handles, pause = a.pause }, n = ctx:label(), f = route_hold_f })
end

-- route_deleteall: a delete sent to every child (during a handover, the layout and the one
-- before). Its answer: a child's failure if one failed (a copy may be left), else a child's
-- that found the key, else not found. route_allsync answers the last child's, NOT_FOUND from
-- the layout that did not hold the key.
register_route_handlers({ "deleteall" })

function route_deleteall_conf(t, ctx)
    return t
end

local function route_deleteall_f(rctx, handles)
    local not_found = mcp.MCMC_CODE_NOT_FOUND
    return function(r)
        rctx:enqueue(r, handles)
        rctx:wait_cond(#handles, mcp.WAIT_ANY)
        local failed, found, missed = nil, nil, nil
        for x = 1, #handles do
            local res = rctx:result(handles[x])
            if res == nil then
                -- nothing to answer with from this child
            elseif not res:ok() then
                failed = failed or res
            elseif res:code() == not_found then
                missed = missed or res
            else
                found = found or res
            end
        end
        return failed or found or missed
    end
end

function route_deleteall_start(a, ctx, fgen)
    fgen:ready({ a = handles_of(fgen, a.children), n = ctx:label(), f = route_deleteall_f })
end

-- route_zwrite: with zone-local reads, a write sent to the pool of every zone, the proxy's own
-- first. Its answer is the first zone's that answered (the proxy's own, unless it failed). A
-- zone that answered otherwise (a cas that matched only the copy the client read, an add where
-- that zone still had the key, a zone down) loses its copy of the key: a read there then misses
-- and asks the other zones, instead of finding a value the client was not told of.
register_route_handlers({ "zwrite" })

function route_zwrite_conf(t, ctx)
    return t
end

local function route_zwrite_f(rctx, a)
    local writes, deletes = a.writes, a.deletes
    return function(r)
        rctx:enqueue(r, writes)
        rctx:wait_cond(#writes, mcp.WAIT_ANY)
        local answer = nil
        for x = 1, #writes do
            local res = rctx:result(writes[x])
            if res ~= nil and res:ok() then
                answer = res
                break
            end
            answer = answer or res
        end
        if answer == nil then
            return nil
        end
        local stale = {}
        for x = 1, #writes do
            local res = rctx:result(writes[x])
            if res == nil or not res:ok() or res:code() ~= answer:code() then
                table.insert(stale, deletes[x])
            end
        end
        local key = r:key()
        if #stale > 0 and key ~= nil and key ~= "" then
            rctx:enqueue(mcp.request("delete " .. key .. "\r\n"), stale)
            rctx:wait_cond(#stale, mcp.WAIT_ANY)
        end
        return answer
    end
end

function route_zwrite_start(a, ctx, fgen)
    local writes, deletes = handles_of(fgen, a.children), handles_of(fgen, a.children)
    fgen:ready({ a = { writes = writes, deletes = deletes }, n = ctx:label(), f = route_zwrite_f })
end
