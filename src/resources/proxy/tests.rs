use super::*;
use crate::fixtures::memcached;

fn proxied(size: i32) -> Memcached {
    let mut mc = memcached("cache", size);
    mc.spec.proxy = Some(ProxySpec {
        enabled: true,
        ..ProxySpec::default()
    });
    mc
}

#[test]
fn the_layout_is_the_members_addresses_in_ordinal_order() {
    let layout = Layout::of(&proxied(3), 3, None);
    assert_eq!(
        layout.members,
        [
            "cache-0.cache.default.svc:11211",
            "cache-1.cache.default.svc:11211",
            "cache-2.cache.default.svc:11211"
        ]
    );
    let lua = layout.render("");
    let at = |m: &str| lua.find(&format!("\"{m}\"")).unwrap();
    assert!(at(&layout.members[0]) < at(&layout.members[1]));
    assert!(at(&layout.members[1]) < at(&layout.members[2]));
    assert!(lua.contains("route_direct{ child = \"members\" }"), "{lua}");
}

#[test]
fn no_members_route_every_command_to_a_miss_not_to_an_empty_pool() {
    let lua = Layout::of(&proxied(0), 0, None).render("");
    assert!(lua.contains("route_null"), "{lua}");
    assert!(!lua.contains("pools{"), "{lua}");
}

#[test]
fn the_check_takes_what_the_operator_writes_even_for_a_thousand_members() {
    let mc = proxied(1000);
    let cm = config_map(&mc, &Layout::of(&mc, 1000, Some(999)));
    let text = &cm.data.as_ref().unwrap()[LAYOUT_KEY];
    assert!(text.len() < MAX_LAYOUT_BYTES, "{}", text.len());
    assert_eq!(Layout::check(text).unwrap().members.len(), 1000);
}

#[test]
fn the_check_refuses_what_memcached_could_not_load_or_should_not_run() {
    let refused = [
        ("not json", "{\"members\": [", "not JSON"),
        (
            "no port",
            r#"{"members": ["cache-0.cache"]}"#,
            "not host:port",
        ),
        ("port 0", r#"{"members": ["a:0"]}"#, "port"),
        ("port too big", r#"{"members": ["a:70000"]}"#, "port"),
        (
            "a quote",
            r#"{"members": ["a\"}os.exit(1)--:11211"]}"#,
            "host",
        ),
        ("a space", r#"{"members": ["a b:11211"]}"#, "host"),
        ("upper case", r#"{"members": ["A:11211"]}"#, "host"),
        ("an empty label", r#"{"members": ["a..b:11211"]}"#, "host"),
        ("twice", r#"{"members": ["a:1", "a:1"]}"#, "twice"),
    ];
    for (what, text, says) in refused {
        let error = Layout::check(text).expect_err(what);
        assert!(error.contains(says), "{what}: {error}");
    }
    let huge = format!(r#"{{"members": ["{}"]}}"#, "a".repeat(MAX_LAYOUT_BYTES));
    assert!(Layout::check(&huge).unwrap_err().contains("bytes"));
    assert_eq!(
        Layout::check(r#"{"members": ["10.0.0.7:11211", "m-1.svc:1"]}"#)
            .unwrap()
            .members
            .len(),
        2
    );
}

#[test]
fn nothing_without_the_proxy_and_no_budget_for_a_single_proxy() {
    let mut mc = memcached("cache", 3);
    assert!(service(&mc).is_none());
    assert!(deployment(&mc, "m", "a").is_none() && pod_disruption_budget(&mc).is_none());
    mc.spec.proxy = Some(ProxySpec::default());
    assert!(!enabled(&mc), "off unless enabled");
    mc.spec.proxy = Some(ProxySpec {
        enabled: true,
        replicas: 1,
        ..ProxySpec::default()
    });
    assert!(pod_disruption_budget(&mc).is_none());
    assert!(pod_disruption_budget(&proxied(3)).is_some());
}

#[test]
fn a_change_of_members_changes_the_layout_but_never_the_proxies_pods() {
    let (three, four) = (proxied(3), proxied(4));
    assert_eq!(
        deployment(&three, "memcached:1.6.45", "agent"),
        deployment(&four, "memcached:1.6.45", "agent")
    );
}

#[test]
fn the_proxy_pods_are_not_members_and_run_restricted() {
    let mc = proxied(3);
    let deployment = deployment(&mc, "memcached:1.6.45", "agent:1").unwrap();
    let spec = deployment.spec.unwrap();
    let labels = spec.template.metadata.unwrap().labels.unwrap();
    assert_eq!(labels[LABEL_NAME], NAME_LABEL);
    assert!(!labels.contains_key(super::super::LABEL_MANAGED_BY));
    let pod = spec.template.spec.unwrap();
    assert_eq!(pod.share_process_namespace, Some(true));
    for c in pod
        .containers
        .iter()
        .chain(pod.init_containers.iter().flatten())
    {
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.read_only_root_filesystem, Some(true), "{}", c.name);
        assert_eq!(sc.run_as_user, Some(MEMCACHED_UID), "{}", c.name);
    }
    let proxy = &pod.containers[0];
    assert_eq!(proxy.image.as_deref(), Some("memcached:1.6.45"));
    assert!(
        proxy
            .args
            .as_ref()
            .unwrap()
            .iter()
            .any(|a| a
                == "proxy_config=routelib:/run/memcached-proxy/routes.lua,proxy_arg=/run/memcached-proxy/config.lua"),
        "{:?}",
        proxy.args
    );
    // A proxy replaced leaves the Service before memcached closes its clients' connections.
    let pre_stop = proxy.lifecycle.as_ref().unwrap().pre_stop.as_ref().unwrap();
    assert_eq!(pre_stop.sleep.as_ref().unwrap().seconds, 5);
    assert_eq!(address(&mc), "cache-proxy.default.svc:11211");
    assert_eq!(
        service(&mc).unwrap().spec.unwrap().selector.unwrap()[LABEL_NAME],
        NAME_LABEL
    );
}

#[test]
fn during_a_handover_reads_that_miss_ask_the_previous_layout_and_deletes_go_to_both() {
    let mc = proxied(4);
    let layout = Layout::of(&mc, 4, Some(3));
    assert_eq!(layout.previous.len(), 3);
    assert_eq!(layout.previous[..], layout.members[..3]);
    let lua = layout.render("");
    for read in ["get", "gets", "gat", "gats", "mg"] {
        assert!(
            lua.contains(&format!(
                "{read} = route_failover{{ children = {{ \"members\", \"previous\" }}, miss = true }}"
            )),
            "{lua}"
        );
    }
    for delete in ["delete", "md"] {
        assert!(
            lua.contains(&format!("{delete} = route_deleteall{{")),
            "{lua}"
        );
    }
    assert!(
        lua.contains("default = route_direct{ child = \"members\" }"),
        "{lua}"
    );
    // Scaled in: the previous layout holds the member that drains.
    let layout = Layout::of(&proxied(3), 3, Some(4));
    assert_eq!(layout.previous[3], "cache-3.cache.default.svc:11211");
    let text = serde_json::to_string(&layout).unwrap();
    assert_eq!(Layout::check(&text).unwrap(), layout);
    assert!(Layout::check(r#"{"members": [], "previous": ["a:1"]}"#).is_err());
}

#[test]
fn an_image_older_than_the_proxy_is_named_with_its_field() {
    assert_eq!(
        too_old("localhost/memcached:1.6.18-debian").as_deref(),
        Some("1.6.18")
    );
    assert_eq!(too_old("memcached:1.5.22").as_deref(), Some("1.5.22"));
    // The proxy without its route library embedded, which the pods' configuration names.
    assert_eq!(too_old("memcached:1.6.23").as_deref(), Some("1.6.23"));
    for has_it in [
        "memcached:1.6.33",
        "memcached:1.6.45-alpine",
        "localhost/memcached:1.6.45-sid",
        "registry:5000/memcached",
        "memcached@sha256:0123",
        "memcached:latest",
        "memcached",
    ] {
        assert_eq!(too_old(has_it), None, "{has_it}");
    }
    let mut mc = proxied(3);
    assert_eq!(invalid_image(&mc, "memcached:1.6.45-alpine"), None);
    let default = invalid_image(&mc, "memcached:1.6.18").unwrap();
    assert!(
        default.starts_with("the operator's default memcached image"),
        "{default}"
    );
    mc.spec.image = Some("memcached:1.6.9".into());
    assert!(invalid_image(&mc, "x").unwrap().starts_with("spec.image"));
    mc.spec.proxy.as_mut().unwrap().image = Some("memcached:1.6.22".into());
    let named = invalid_image(&mc, "x").unwrap();
    assert!(
        named.starts_with("spec.proxy.image: memcached:1.6.22 is memcached 1.6.22"),
        "{named}"
    );
    mc.spec.proxy.as_mut().unwrap().image = Some("memcached:1.6.45".into());
    assert_eq!(invalid_image(&mc, "x"), None);
}

/// The proxy pods' spec, of the members' default image 1.6.45.
fn pod_spec(mc: &Memcached) -> PodSpec {
    deployment(mc, "memcached:1.6.45", "operator:1")
        .unwrap()
        .spec
        .unwrap()
        .template
        .spec
        .unwrap()
}

#[test]
fn with_monitoring_the_agents_serve_the_proxys_metrics_where_the_monitor_looks() {
    let mut mc = proxied(3);
    let plain_agent = pod_spec(&mc).containers[1].clone();
    mc.spec.monitoring = Some(crate::api::MonitoringSpec {
        enabled: true,
        image: None,
    });
    let pod = pod_spec(&mc);
    let agent = pod
        .containers
        .iter()
        .find(|c| c.name == AGENT_CONTAINER)
        .unwrap();
    let args = agent.args.clone().unwrap();
    assert!(
        args.contains(&"--metrics-address=0.0.0.0:9150".to_string()),
        "{args:?}"
    );
    assert!(
        args.contains(&"--memcached=127.0.0.1:11211".to_string()),
        "{args:?}"
    );
    assert_eq!(
        agent.ports.as_ref().unwrap()[0].name.as_deref(),
        Some("metrics")
    );
    // The init container renders once and serves nothing.
    let inits = pod.init_containers.unwrap();
    let init = inits.iter().find(|c| c.name == "route-init").unwrap();
    assert!(
        !init
            .args
            .as_ref()
            .unwrap()
            .iter()
            .any(|a| a.starts_with("--metrics"))
    );
    // Without monitoring, the template is as it was: turning it on is what rolls the proxies.
    assert_eq!(plain_agent.ports, None);

    let svc = service(&mc).unwrap().spec.unwrap();
    let names: Vec<_> = svc
        .ports
        .unwrap()
        .into_iter()
        .map(|p| p.name.unwrap())
        .collect();
    assert_eq!(names, ["memcached", "metrics"]);
    // The one ServiceMonitor selects the members' Service and the proxy's, by their labels.
    let monitor = crate::resources::service_monitor(&mc).unwrap();
    let selector = monitor.spec.selector;
    for labels in [
        service(&mc).unwrap().metadata.labels.unwrap(),
        crate::resources::service(&mc).metadata.labels.unwrap(),
    ] {
        let matches = selector
            .match_labels
            .iter()
            .flatten()
            .all(|(k, v)| labels.get(k) == Some(v))
            && selector.match_expressions.iter().flatten().all(|e| {
                e.values
                    .iter()
                    .flatten()
                    .any(|v| labels.get(&e.key) == Some(v))
            });
        assert!(matches, "{labels:?} by {selector:?}");
    }
}

#[test]
fn an_image_without_the_proxy_is_told_by_its_check_and_named_with_its_field() {
    let mut mc = proxied(3);
    mc.spec.proxy.as_mut().unwrap().image = Some("my/memcached:custom".into());
    let pod_spec = pod_spec(&mc);
    let check = &pod_spec.init_containers.as_ref().unwrap()[0];
    assert_eq!(check.name, CHECK_CONTAINER, "the check runs first");
    assert_eq!(check.image.as_deref(), Some("my/memcached:custom"));
    assert_eq!(
        check.args.as_deref().unwrap(),
        ["-o", "proxy_config=routelib", "-V"]
    );
    // A pod whose check exited, as the kubelet reports it (memcached's message as the
    // termination message), then one restarted and waiting.
    let pod = |image: &str, terminated: serde_json::Value| -> k8s_openapi::api::core::v1::Pod {
        serde_json::from_value(serde_json::json!({
            "spec": {"containers": [], "initContainers": [{"name": CHECK_CONTAINER, "image": image}]},
            "status": {"initContainerStatuses": [{
                "name": CHECK_CONTAINER, "image": image, "imageID": "", "ready": false,
                "restartCount": 1,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": terminated},
            }]},
        }))
        .unwrap()
    };
    let refused = pod(
        "my/memcached:custom",
        serde_json::json!({"exitCode": 1, "message": "Illegal suboption \"proxy_config=routelib\"\n"}),
    );
    let said = failed_check(std::slice::from_ref(&refused), "my/memcached:custom").unwrap();
    assert_eq!(said, "Illegal suboption \"proxy_config=routelib\"\n");
    let message = refused_image(&mc, "x", &said).unwrap();
    assert!(
        message.starts_with("spec.proxy.image: my/memcached:custom cannot run memcached's proxy (memcached says: Illegal suboption"),
        "{message}"
    );
    // A pod of another image (since changed), or one whose check passed, says nothing.
    assert_eq!(
        failed_check(std::slice::from_ref(&refused), "memcached:1.6.45"),
        None
    );
    let passed = pod("my/memcached:custom", serde_json::json!({"exitCode": 0}));
    assert_eq!(failed_check(&[passed], "my/memcached:custom"), None);
    // Failed once, passed since: the pod's check now terminated with 0.
    let mut recovered = refused.clone();
    let statuses = recovered
        .status
        .as_mut()
        .unwrap()
        .init_container_statuses
        .as_mut()
        .unwrap();
    statuses[0].state = serde_json::from_value(
        serde_json::json!({"terminated": {"exitCode": 0, "reason": "Completed"}}),
    )
    .unwrap();
    assert_eq!(failed_check(&[recovered], "my/memcached:custom"), None);
    let silent = pod("my/memcached:custom", serde_json::json!({"exitCode": 64}));
    assert_eq!(
        failed_check(&[silent], "my/memcached:custom").as_deref(),
        Some("exit code 64")
    );
}

#[test]
fn with_auth_and_tls_the_agent_serves_the_clients_and_the_proxy_reaches_the_members_agents() {
    let plain = proxied(2);
    let mut mc = proxied(2);
    mc.spec.auth = serde_json::from_value(serde_json::json!({"enabled": true})).unwrap();
    mc.spec.tls = serde_json::from_value(serde_json::json!({
        "enabled": true, "secretName": "cert", "clientCASecretName": "ca", "plaintextPort": 11300,
    }))
    .unwrap();
    let pod = pod_spec(&mc);
    let proxy = &pod.containers[0];
    let args = proxy.args.clone().unwrap();
    assert!(args.contains(&"--listen=127.0.0.1".to_string()), "{args:?}");
    assert!(args.contains(&"--port=11298".to_string()), "{args:?}");
    assert_eq!(
        proxy.ports, None,
        "memcached serves the pod's loopback only"
    );
    let agent = &pod.containers[1];
    let args = agent.args.clone().unwrap();
    for arg in [
        "--memcached=127.0.0.1:11298",
        "--listen=0.0.0.0:11211",
        "--ready-address=0.0.0.0:11297",
        "--max-connections=1024",
        "--plain-listen=0.0.0.0:11300",
        "--credentials=/etc/memcached/credentials",
        "--rotation-grace=300s",
        "--tls-dir=/etc/memcached/tls",
        "--client-ca-dir=/etc/memcached/client-ca",
    ] {
        assert!(args.contains(&arg.to_string()), "{arg} in {args:?}");
    }
    let ports: Vec<_> = agent
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.clone().unwrap(), p.container_port))
        .collect();
    assert_eq!(
        ports,
        [
            ("memcached".to_string(), 11211),
            ("memcached-plain".to_string(), 11300)
        ]
    );
    let mounted: Vec<_> = agent
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| m.mount_path.as_str())
        .collect();
    assert!(
        mounted.contains(&"/etc/memcached/credentials")
            && mounted.contains(&"/etc/memcached/tls")
            && mounted.contains(&"/etc/memcached/client-ca"),
        "{mounted:?}"
    );
    let volumes = pod.volumes.unwrap();
    assert!(
        volumes.iter().all(|v| v.name != "auth"),
        "no password file: the agent checks logins itself"
    );
    // The Service serves both ports; the route goes to each member's agent.
    let names: Vec<_> = service(&mc)
        .unwrap()
        .spec
        .unwrap()
        .ports
        .unwrap()
        .into_iter()
        .map(|p| p.name.unwrap())
        .collect();
    assert_eq!(names, ["memcached", "memcached-plain"]);
    assert_eq!(
        Layout::of(&mc, 1, None).members,
        ["cache-0.cache.default.svc:11296"]
    );
    assert_eq!(
        Layout::of(&plain, 1, None).members,
        ["cache-0.cache.default.svc:11211"]
    );
    assert_eq!(
        crate::resources::relay::member_agent_args(&mc),
        ["--backend-listen=0.0.0.0:11296"]
    );
    assert!(crate::resources::relay::member_agent_args(&plain).is_empty());
    // Without auth or TLS nothing of this is in the proxy's pods.
    let plain_agent = pod_spec(&plain).containers[1].args.clone().unwrap();
    assert!(!plain_agent.iter().any(|a| a.starts_with("--listen")));
}

#[test]
fn a_key_moves_only_to_a_member_added_and_each_member_owns_its_share() {
    let keys: Vec<String> = (0..10_000).map(|i| format!("app-{i}")).collect();
    for members in 1..8 {
        let mut held = vec![0; members];
        for key in &keys {
            let before = owner(key.as_bytes(), members);
            held[before] += 1;
            let after = owner(key.as_bytes(), members + 1);
            assert!(
                after == before || after == members,
                "{key}: {before} -> {after}"
            );
        }
        let share = keys.len() / members;
        assert!(
            held.iter()
                .all(|n| n * 10 > share * 8 && n * 10 < share * 12),
            "{held:?}"
        );
    }
    assert_eq!(owner(b"app-0", 1), 0);
}

#[test]
fn while_the_members_are_updated_every_route_holds_what_no_member_answered() {
    let mut layout = Layout::of(&proxied(4), 4, Some(3));
    assert!(!layout.render("").contains("route_hold"));
    layout.hold = true;
    let lua = layout.render("");
    let holds = |route: &str| format!("route_hold{{ child = {route}, tries = 21, pause = 0.25 }}");
    assert!(
        lua.contains(&format!(
            "default = {},",
            holds("route_direct{ child = \"members\" }")
        )),
        "{lua}"
    );
    for command in ["get", "mg", "delete", "md"] {
        assert!(lua.contains(&format!("{command} = route_hold{{")), "{lua}");
    }
    // The agent reads it back as written; a layout of a release before knows no hold.
    let text = serde_json::to_string(&layout).unwrap();
    assert_eq!(Layout::check(&text).unwrap(), layout);
    let before = r#"{"members": ["cache-0.cache.default.svc:11211"]}"#;
    assert!(!Layout::check(before).unwrap().hold);
    // The handlers the routes name are the library's.
    for handler in ["hold", "deleteall"] {
        let registered = format!("register_route_handlers({{ \"{handler}\" }})");
        assert!(ROUTES_LIBRARY.contains(&registered), "{handler}");
    }
}

fn zoned(size: i32) -> Memcached {
    let mut mc = proxied(size);
    mc.spec.proxy.as_mut().unwrap().zone_local_reads = true;
    mc
}

#[test]
fn with_zone_local_reads_each_zone_holds_a_copy_and_reads_ask_the_proxys_own_zone_first() {
    let zones = ["b", "a", "c", "a"];
    let zone = |n: i32| zones.get(n as usize).map(|z| z.to_string());
    let layout = Layout::of(&zoned(4), 4, None).in_zones(&zoned(4), zone);
    assert_eq!(layout.zones, zones);
    let member = |n: usize| format!("\"{}\"", layout.members[n]);
    // A proxy in zone a: its own zone's pool first (cache-1 and cache-3), then b, then c.
    let lua = layout.render("a");
    let pool = |name: &str| {
        let at = lua.find(&format!("    {name} = {{")).unwrap();
        let end = at + lua[at..].find("    },\n").unwrap();
        lua[at..end].to_string()
    };
    assert!(pool("zone0").contains(&member(1)) && pool("zone0").contains(&member(3)));
    assert!(!pool("zone0").contains(&member(0)), "{lua}");
    assert!(pool("zone1").contains(&member(0)), "{lua}");
    assert!(pool("zone2").contains(&member(2)), "{lua}");
    let all = "children = { \"zone0\", \"zone1\", \"zone2\" }";
    for read in ["get", "gets", "gat", "gats", "mg"] {
        let route = format!("{read} = route_failover{{ {all}, miss = true }}");
        assert!(lua.contains(&route), "{lua}");
    }
    for delete in ["delete", "md"] {
        assert!(
            lua.contains(&format!("{delete} = route_deleteall{{ {all} }}")),
            "{lua}"
        );
    }
    assert!(
        lua.contains(&format!("default = route_zwrite{{ {all} }}")),
        "{lua}"
    );
    // A proxy in zone c asks c first; one whose zone is unknown (or has no members) asks the
    // zones by name.
    let in_c = layout.render("c");
    assert!(in_c.contains("-- zone \"c\"\n    zone0 = {"), "{in_c}");
    let unknown = layout.render("");
    assert!(
        unknown.contains("-- zone \"a\"\n    zone0 = {"),
        "{unknown}"
    );
    assert!(
        unknown.contains("-- zone \"c\"\n    zone2 = {"),
        "{unknown}"
    );
    // During a handover each zone's previous members are asked after its own; writes go to
    // the layout's pools alone, deletes to all.
    let handover = Layout::of(&zoned(4), 4, Some(3)).in_zones(&zoned(4), zone);
    let lua = handover.render("a");
    let reads = "children = { \"zone0\", \"zone0_previous\", \"zone1\", \"zone1_previous\", \"zone2\", \"zone2_previous\" }";
    assert!(
        lua.contains(&format!("get = route_failover{{ {reads}, miss = true }}")),
        "{lua}"
    );
    assert!(
        lua.contains(&format!("delete = route_deleteall{{ {reads} }}")),
        "{lua}"
    );
    assert!(
        lua.contains(&format!("default = route_zwrite{{ {all} }}")),
        "{lua}"
    );
    // One zone: as without zones, one pool.
    let one = Layout::of(&zoned(2), 2, None).in_zones(&zoned(2), |_| Some("a".into()));
    assert!(
        one.render("a")
            .contains("default = route_direct{ child = \"zone0\" }")
    );
    // The agent reads back what the operator writes; zones off, none are written.
    let text = serde_json::to_string(&handover).unwrap();
    assert_eq!(Layout::check(&text).unwrap(), handover);
    let off = Layout::of(&proxied(4), 4, None).in_zones(&proxied(4), zone);
    assert!(!serde_json::to_string(&off).unwrap().contains("zones"));
    assert!(ROUTES_LIBRARY.contains("register_route_handlers({ \"zwrite\" })"));
}

#[test]
fn the_check_refuses_zones_that_do_not_match_the_members_or_are_no_labels_value() {
    let members = r#""members": ["a:1", "b:1"]"#;
    let refused = [
        (
            format!("{{{members}, \"zones\": [\"a\"]}}"),
            "1 zones for 2 members",
        ),
        (
            format!("{{{members}, \"zones\": [\"a\", \"b\"], \"previous\": [\"a:1\"]}}"),
            "0 zones for 1 members",
        ),
        (
            format!("{{{members}, \"zones\": [\"a\", \"-b\"]}}"),
            "not a label's value",
        ),
        (
            format!("{{{members}, \"zones\": [\"a\", \"b\\n}}\"]}}"),
            "not a label's value",
        ),
        (
            format!("{{{members}, \"zones\": [\"a\", \"{}\"]}}", "z".repeat(64)),
            "not a label's value",
        ),
    ];
    for (text, why) in refused {
        let error = Layout::check(&text).unwrap_err();
        assert!(error.contains(why), "{text}: {error}");
    }
    let taken = format!("{{{members}, \"zones\": [\"eu-west-1a\", \"\"]}}");
    assert_eq!(Layout::check(&taken).unwrap().zones, ["eu-west-1a", ""]);
}
