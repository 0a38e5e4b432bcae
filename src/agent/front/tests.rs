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

/// The front door on a port of its own, in front of the stand-in.
async fn front(door: Door) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (door, receiver) = watch::channel(door);
    std::mem::forget(door);
    tokio::spawn(accept(listener, memcached().await, receiver, true));
    addr
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
    let addr = front(Door {
        logins: Some(vec![creds("new"), creds("old")]),
        tls: None,
    })
    .await;
    let mut conn = BufReader::new(TcpStream::connect(addr).await.unwrap());
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
    let mut conn = BufReader::new(TcpStream::connect(addr).await.unwrap());
    assert_eq!(
        exchange(&mut conn, "set a 0 0 7\r\napp old\r\nget k\r\n").await,
        "STORED"
    );
    let mut line = String::new();
    conn.read_line(&mut line).await.unwrap();
    assert_eq!(line, "END\r\n", "the pipelined command reached the proxy");

    let mut conn = BufReader::new(TcpStream::connect(addr).await.unwrap());
    assert_eq!(
        exchange(&mut conn, "set a 0 0 5\r\napppw\r\n").await,
        "CLIENT_ERROR bad authentication token format"
    );
}

#[tokio::test]
async fn without_auth_every_command_is_relayed() {
    let addr = front(Door {
        logins: None,
        tls: None,
    })
    .await;
    let mut conn = BufReader::new(TcpStream::connect(addr).await.unwrap());
    assert_eq!(exchange(&mut conn, "get k\r\n").await, "END");
}

/// A CA, and a server certificate for `cache-proxy.ns.svc` signed by it, as files of a
/// `kubernetes.io/tls` Secret in `dir`; the CA's certificate.
fn issue(dir: &Path) -> CertificateDer<'static> {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["cache-proxy.ns.svc".to_string()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(CERT_KEY), cert.pem()).unwrap();
    std::fs::write(dir.join(PRIVATE_KEY_KEY), key.serialize_pem()).unwrap();
    std::fs::write(dir.join(CA_KEY), ca_cert.pem()).unwrap();
    ca_cert.der().clone()
}

#[tokio::test]
async fn tls_clients_verify_the_proxys_name_and_log_in_inside_tls() {
    let dir = std::env::temp_dir().join(format!("agent-front-{}", std::process::id()));
    let ca = issue(&dir);
    let addr = front(Door {
        logins: Some(vec![creds("pw")]),
        tls: Some(TlsAcceptor::from(server_config(&dir, None).unwrap())),
    })
    .await;
    let mut roots = RootCertStore::empty();
    roots.add(ca).unwrap();
    let config =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
    let connector = TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("cache-proxy.ns.svc").unwrap();
    let mut conn = BufReader::new(connector.connect(name, tcp).await.unwrap());
    assert_eq!(
        exchange(&mut conn, "set a 0 0 6\r\napp pw\r\n").await,
        "STORED"
    );
    assert_eq!(exchange(&mut conn, "get k\r\n").await, "END");

    // Plain text on the TLS port gets nothing.
    let mut plain = BufReader::new(TcpStream::connect(addr).await.unwrap());
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

    // With client verification, a client without a certificate is refused.
    let mutual = TlsAcceptor::from(server_config(&dir, Some(&dir)).unwrap());
    let addr = front(Door {
        logins: None,
        tls: Some(mutual),
    })
    .await;
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("cache-proxy.ns.svc").unwrap();
    let refused = async {
        let mut conn = BufReader::new(connector.connect(name, tcp).await?);
        conn.get_mut().write_all(b"get k\r\n").await?;
        let mut line = String::new();
        conn.read_line(&mut line).await?;
        Ok::<_, io::Error>(line)
    };
    assert!(refused.await.is_err(), "no client certificate");
    std::fs::remove_dir_all(&dir).unwrap();
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
    assert!(!keeper.sync(t0), "nothing changed");
    std::fs::write(dir.join("password"), "two").unwrap();
    assert!(keeper.sync(t0));
    assert_eq!(
        keeper.door().unwrap().logins.unwrap(),
        vec![creds("two"), creds("one")]
    );
    assert!(keeper.sync(t0 + Duration::from_secs(61)), "the grace ended");
    assert_eq!(keeper.door().unwrap().logins.unwrap(), vec![creds("two")]);
    std::fs::remove_dir_all(&dir).unwrap();
}
