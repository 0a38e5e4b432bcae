#!/usr/bin/python3
"""An application using pymemcache (Debian's python3-pymemcache), as the real-node tests drive it.

Reads a request on stdin, prints the answer on stdout, both JSON:
  request: {"servers": ["host:port", ...],   a hashing client over these (one: a plain client)
            "addresses": {"host": "ip"},     names as the cluster's DNS answered the test
            "ca": "PEM" | null,              TLS, verifying the server's name against this CA
            "login": ["user", "password"] | null,
            "keys": n,                        written (unless "write": false), then read back
            "write": true | false,            false: only read
            "flush": true | false,            flush every server first
            "cache_aside": {"keys": n, "value_bytes": n, "ttl": seconds}}
                                              instead of the above: one pass over the keys in
                                              a random order as an application with a database
                                              behind the cache does: get, and set what missed
  answer:  {"stored": n, "found": n, "per_server": {"host:port": n}} or {"error": "..."}
           (per_server: where the client puts each key, stored or not);
           with cache_aside {"hits": n, "misses": n, "refused_batches": n}
"""

import json
import random
import socket
import ssl
import sys

from pymemcache.client.base import Client
from pymemcache.client.hash import HashClient
from pymemcache.exceptions import MemcacheServerError

request = json.load(sys.stdin)


class ClusterNames:
    """The socket module, resolving the cluster's names as its DNS answered the test: the host
    does not use the cluster's DNS, and TLS must still check the name the client asked for."""

    def __getattr__(self, name):
        return getattr(socket, name)

    def getaddrinfo(self, host, port, *args):
        return socket.getaddrinfo(request.get("addresses", {}).get(host, host), port, *args)


class LoginClient(Client):
    """memcached's ASCII authentication: a new connection's first set carries the login."""

    def _connect(self):
        super()._connect()
        user, password = request["login"]
        self.set("login", f"{user} {password}", noreply=False)


class App(HashClient):
    client_class = LoginClient if request.get("login") else Client


def server(spec):
    host, port = spec.rsplit(":", 1)
    return (host, int(port))


def main():
    tls = ssl.create_default_context(cadata=request["ca"]) if request.get("ca") else None
    options = dict(tls_context=tls, socket_module=ClusterNames(), connect_timeout=3, timeout=3)
    servers = [server(s) for s in request["servers"]]
    if len(servers) == 1:
        client = App.client_class(servers[0], **options)
        server_of = lambda key: request["servers"][0]
    else:
        # No retries and no dead servers: a failure is the answer.
        client = App(servers, retry_attempts=1, dead_timeout=0, **options)
        server_of = lambda key: "%s:%d" % client._get_client(key).server
    if request.get("cache_aside"):
        return cache_aside(client, **request["cache_aside"])
    if request.get("flush"):
        client.flush_all(noreply=False)
    prefix = request.get("values", "value")
    keys = {f"app-{i}": f"{prefix}-{i}" for i in range(request["keys"])}
    per_server, stored = {}, 0
    for key, value in keys.items():
        if request.get("write", True):
            if not client.set(key, value, noreply=False):
                raise RuntimeError(f"set {key} not stored")
            stored += 1
        per_server[server_of(key)] = per_server.get(server_of(key), 0) + 1
    got = client.get_many(list(keys))
    found = sum(1 for key, value in keys.items() if got.get(key) == value.encode())
    return {"stored": stored, "found": found, "per_server": per_server}


def cache_aside(client, keys, value_bytes, ttl):
    order = [f"aside-{i}" for i in range(keys)]
    random.shuffle(order)
    hits = misses = refused = 0
    for start in range(0, len(order), 100):
        batch = order[start:start + 100]
        got = client.get_many(batch)
        hits += len(got)
        missed = {key: key.encode().ljust(value_bytes, b"v") for key in batch if key not in got}
        misses += len(missed)
        if missed:
            # A cache that refuses a set ("out of memory storing object": memcached found no
            # item to evict in time) is a miss next time, as for any application.
            try:
                client.set_many(missed, expire=ttl, noreply=False)
            except MemcacheServerError:
                refused += 1
    return {"hits": hits, "misses": misses, "refused_batches": refused}


try:
    answer = main()
except Exception as e:  # the test reads what went wrong
    answer = {"error": f"{type(e).__name__}: {e}"}
json.dump(answer, sys.stdout)
