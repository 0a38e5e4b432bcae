use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::ClientConfig;
use tokio_rustls::rustls::pki_types::ServerName;

use super::*;

fn creds(password: &str) -> Credentials {
    Credentials {
        username: "app".into(),
        password: password.into(),
    }
}

/// A stand-in for memcached's proxy: answers every line with `END`.
async fn memcached() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (conn, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let mut conn = BufReader::new(conn);
                let mut line = String::new();
                while conn.read_line(&mut line).await.unwrap_or(0) > 0 {
                    conn.get_mut().write_all(b"END\r\n").await.unwrap();
                    line.clear();
                }
            });
        }
    });
    addr
}

/// The front door on a port of its own, in front of the stand-in, holding connections to
/// `logins` (what the sender says at each login) and, if given, TLS.
async fn front(
    logins: Option<Vec<Credentials>>,
    tls: Option<TlsAcceptor>,
    max_connections: usize,
) -> (SocketAddr, watch::Sender<Option<Vec<Credentials>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (logins, logins_seen) = watch::channel(logins);
    let (tls, tls_seen) = watch::channel(tls);
    std::mem::forget(tls);
    let door = Door {
        logins: logins_seen,
        tls: tls_seen,
        slots: Arc::new(Semaphore::new(max_connections)),
        memcached: memcached().await,
    };
    tokio::spawn(accept(listener, door, true));
    (addr, logins)
}

/// A plain connection to the front door.
async fn connect(addr: SocketAddr) -> BufReader<TcpStream> {
    BufReader::new(TcpStream::connect(addr).await.unwrap())
}

async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    conn: &mut BufReader<S>,
    send: &str,
) -> String {
    conn.get_mut().write_all(send.as_bytes()).await.unwrap();
    let mut line = String::new();
    conn.read_line(&mut line).await.unwrap();
    line.trim_end().to_string()
}

#[tokio::test]
async fn a_client_is_held_to_memcacheds_login_before_it_reaches_the_proxy() {
    let (addr, _logins) = front(Some(vec![creds("new"), creds("old")]), None, 8).await;
    let mut conn = connect(addr).await;
    assert_eq!(
        exchange(&mut conn, "get k\r\n").await,
        "CLIENT_ERROR unauthenticated"
    );
    assert_eq!(
        exchange(&mut conn, "set a 0 0 9\r\napp wrong\r\n").await,
        "CLIENT_ERROR authentication failure"
    );
    assert_eq!(
        exchange(&mut conn, "set a 0 0 7\r\napp new\r\n").await,
        "STORED"
    );
    assert_eq!(exchange(&mut conn, "get k\r\n").await, "END", "relayed");

    // The password kept for the rotation's grace, and a command sent with the login.
    let mut conn = connect(addr).await;
    assert_eq!(
        exchange(&mut conn, "set a 0 0 7\r\napp old\r\nget k\r\n").await,
        "STORED"
    );
    let mut line = String::new();
    conn.read_line(&mut line).await.unwrap();
    assert_eq!(line, "END\r\n", "the pipelined command reached the proxy");

    let mut conn = connect(addr).await;
    assert_eq!(
        exchange(&mut conn, "set a 0 0 5\r\napppw\r\n").await,
        "CLIENT_ERROR bad authentication token format"
    );
}

#[tokio::test]
async fn without_auth_every_command_is_relayed() {
    let (addr, _logins) = front(None, None, 8).await;
    let mut conn = connect(addr).await;
    assert_eq!(exchange(&mut conn, "get k\r\n").await, "END");
}

/// A CA, a server certificate for `cache-proxy.ns.svc` signed by it as the files of a
/// `kubernetes.io/tls` Secret in `dir` (with the CA's `ca.crt`), and a client certificate it
/// signed: (the CA's certificate, the client's certificate and key).
fn issue(
    dir: &Path,
) -> (
    CertificateDer<'static>,
    (CertificateDer<'static>, PrivateKeyDer<'static>),
) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let leaf = |name: &str| {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec![name.to_string()])
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        (cert, key)
    };
    let (cert, key) = leaf("cache-proxy.ns.svc");
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(CERT_KEY), cert.pem()).unwrap();
    std::fs::write(dir.join(PRIVATE_KEY_KEY), key.serialize_pem()).unwrap();
    std::fs::write(dir.join(CA_KEY), ca_cert.pem()).unwrap();
    let (client_cert, client_key) = leaf("app");
    let client_key = PrivateKeyDer::try_from(client_key.serialize_der()).unwrap();
    (
        ca_cert.der().clone(),
        (client_cert.der().clone(), client_key),
    )
}

/// A TLS client trusting `ca`, presenting `client` when given.
fn connector(
    ca: &CertificateDer<'static>,
    client: Option<(CertificateDer<'static>, PrivateKeyDer<'static>)>,
) -> TlsConnector {
    let mut roots = RootCertStore::empty();
    roots.add(ca.clone()).unwrap();
    let builder =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
    let config = match client {
        Some((cert, key)) => builder.with_client_auth_cert(vec![cert], key).unwrap(),
        None => builder.with_no_client_auth(),
    };
    TlsConnector::from(Arc::new(config))
}

/// A `get` over TLS to `addr` as `connector`: the first line answered.
async fn tls_get(connector: &TlsConnector, addr: SocketAddr) -> io::Result<String> {
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from("cache-proxy.ns.svc").unwrap();
    let mut conn = BufReader::new(connector.connect(name, tcp).await?);
    conn.get_mut().write_all(b"get k\r\n").await?;
    let mut line = String::new();
    conn.read_line(&mut line).await?;
    Ok(line.trim_end().to_string())
}

#[tokio::test]
async fn tls_clients_verify_the_proxys_name_and_log_in_inside_tls() {
    let dir = std::env::temp_dir().join(format!("agent-front-{}", std::process::id()));
    let (ca, client) = issue(&dir);
    let acceptor = TlsAcceptor::from(server_config(&dir, None).unwrap());
    let (addr, _logins) = front(Some(vec![creds("pw")]), Some(acceptor), 8).await;
    let anonymous = connector(&ca, None);
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("cache-proxy.ns.svc").unwrap();
    let mut conn = BufReader::new(anonymous.connect(name, tcp).await.unwrap());
    assert_eq!(
        exchange(&mut conn, "set a 0 0 6\r\napp pw\r\n").await,
        "STORED"
    );
    assert_eq!(exchange(&mut conn, "get k\r\n").await, "END");

    // Plain text on the TLS port gets nothing.
    let mut plain = connect(addr).await;
    plain
        .get_mut()
        .write_all(b"set a 0 0 6\r\napp pw\r\n")
        .await
        .unwrap();
    let mut line = String::new();
    assert!(
        plain.read_line(&mut line).await.unwrap_or(0) == 0 || !line.starts_with("STORED"),
        "{line}"
    );

    // With client verification: a client with a certificate the CA signed gets in, one
    // without is refused.
    let mutual = TlsAcceptor::from(server_config(&dir, Some(&dir)).unwrap());
    let (addr, _logins) = front(None, Some(mutual), 8).await;
    assert_eq!(
        tls_get(&connector(&ca, Some(client)), addr).await.unwrap(),
        "END"
    );
    assert!(
        tls_get(&anonymous, addr).await.is_err(),
        "no client certificate"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_login_in_pieces_or_with_extra_spaces_is_memcacheds_and_junk_is_closed() {
    let (addr, _logins) = front(Some(vec![creds("pw")]), None, 8).await;
    let mut conn = connect(addr).await;
    for piece in ["set  a 0", " 0 6\r\napp", " pw\r\n"] {
        conn.get_mut().write_all(piece.as_bytes()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut line = String::new();
    conn.read_line(&mut line).await.unwrap();
    assert_eq!(line, "STORED\r\n");

    // A line too long to be a login, or too short, ends the connection as memcached does.
    for junk in [vec![b'x'; MAX_LINE + 10], b"quit\r\n".to_vec()] {
        let mut conn = connect(addr).await;
        conn.get_mut().write_all(&junk).await.unwrap();
        let mut line = String::new();
        assert_eq!(conn.read_line(&mut line).await.unwrap_or(0), 0, "{line}");
    }
}

#[tokio::test]
async fn a_password_past_its_grace_is_refused_on_a_connection_opened_before() {
    let (addr, logins) = front(Some(vec![creds("new"), creds("old")]), None, 8).await;
    let mut conn = connect(addr).await;
    assert_eq!(
        exchange(&mut conn, "set a 0 0 7\r\napp bad\r\n").await,
        "CLIENT_ERROR authentication failure"
    );
    logins.send_replace(Some(vec![creds("new")]));
    assert_eq!(
        exchange(&mut conn, "set a 0 0 7\r\napp old\r\n").await,
        "CLIENT_ERROR authentication failure"
    );
    assert_eq!(
        exchange(&mut conn, "set a 0 0 7\r\napp new\r\n").await,
        "STORED"
    );
}

#[tokio::test]
async fn past_the_connection_limit_a_client_is_told_as_memcached_tells_it() {
    let (addr, _logins) = front(None, None, 1).await;
    let mut first = connect(addr).await;
    assert_eq!(exchange(&mut first, "get k\r\n").await, "END");
    let mut second = connect(addr).await;
    let mut line = String::new();
    second.read_line(&mut line).await.unwrap();
    assert_eq!(line, "ERROR Too many open connections\r\n");
    drop(first);
    // The slot is free again once the first client left.
    let took = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let mut conn = connect(addr).await;
            conn.get_mut().write_all(b"get k\r\n").await.unwrap();
            let mut line = String::new();
            conn.read_line(&mut line).await.unwrap();
            if line == "END\r\n" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(took.is_ok(), "the slot came back");
}

#[test]
fn a_rotation_is_honoured_by_new_connections_with_the_old_password_for_its_grace() {
    let dir = std::env::temp_dir().join(format!("agent-front-keeper-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("username"), "app").unwrap();
    std::fs::write(dir.join("password"), "one").unwrap();
    let args = FrontArgs {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        credentials: Some(dir.clone()),
        rotation_grace: Duration::from_secs(60),
        ..FrontArgs::default()
    };
    let mut keeper = Keeper::start(&args).unwrap();
    let t0 = Instant::now();
    assert!(!keeper.sync_passwords(t0), "nothing changed");
    std::fs::write(dir.join("password"), "two").unwrap();
    assert!(keeper.sync_passwords(t0));
    assert_eq!(keeper.logins().unwrap(), vec![creds("two"), creds("one")]);
    assert!(
        keeper.sync_passwords(t0 + Duration::from_secs(61)),
        "the grace ended"
    );
    assert_eq!(keeper.logins().unwrap(), vec![creds("two")]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_certificate_that_does_not_load_keeps_the_last_one_and_is_tried_again() {
    let dir = std::env::temp_dir().join(format!("agent-front-renewal-{}", std::process::id()));
    issue(&dir);
    let args = FrontArgs {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        tls_dir: Some(dir.clone()),
        ..FrontArgs::default()
    };
    let mut keeper = Keeper::start(&args).unwrap();
    assert!(keeper.load_tls().unwrap().is_some());
    assert!(keeper.sync_tls().unwrap().is_none(), "unchanged");
    std::fs::write(dir.join(PRIVATE_KEY_KEY), "half a key").unwrap();
    assert!(keeper.sync_tls().is_err());
    assert!(keeper.sync_tls().is_err(), "tried again at the next look");
    issue(&dir);
    assert!(
        keeper.sync_tls().unwrap().is_some(),
        "the renewal, once whole"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
