//! Egress limits (#41, item 5), each hit against real sockets: connections in flight per
//! run, bytes received per run (a real HTTPS download through `requests`), connections
//! per second per tenant, the connect and idle timeouts; memory that stays bounded while a
//! fast upstream sends hundreds of megabytes to a slow reader and while 100 connections
//! trickle; and the latency the proxy adds (printed: `--nocapture`).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use mcp_code_executor::egress::Proxy;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

use super::egress::{connect, http_server, policy, python, read_answer, ProxyServer, TlsUpstream};

/// A listener that accepts and holds every connection, reading and dropping what comes.
async fn holder() -> (u16, tokio::task::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
            });
        }
    });
    (port, task)
}

fn rules_for(port: u16, limits: &str) -> String {
    format!("[limits]\n{limits}\n[[rules]]\nhost = \"127.0.0.1\"\nports = [{port}]\n")
}

#[tokio::test]
async fn connections_in_flight_per_run() {
    let (port, server) = holder().await;
    let proxy = ProxyServer::start(
        Proxy::new(policy(&rules_for(port, "connections_in_flight = 2"))),
        "t",
    )
    .await;
    let target = format!("127.0.0.1:{port}");
    let (s1, _, t1) = connect(proxy.addr, &target).await;
    let (s2, _, _t2) = connect(proxy.addr, &target).await;
    assert_eq!((s1, s2), (200, 200));
    let (s3, text, _) = connect(proxy.addr, &target).await;
    assert_eq!(s3, 429, "{text}");
    assert!(
        text.contains("limit: 2 connections in flight per run"),
        "{text}"
    );
    assert!(text.contains("`connections_in_flight`"), "{text}");
    // A closed tunnel gives its place back.
    drop(t1);
    let mut ok = false;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if connect(proxy.addr, &target).await.0 == 200 {
            ok = true;
            break;
        }
    }
    assert!(ok, "the place of a closed tunnel came back");
    server.abort();
}

#[tokio::test]
async fn bytes_received_per_run_cut_a_download_and_refuse_the_next() {
    let up = TlsUpstream::start(&["data.example.test"]).await;
    let p = up.port;
    let text = format!(
        "[limits]\nbytes_down = \"1m\"\n[resolve]\n\"data.example.test\" = \"127.0.0.1\"\n\
         [[rules]]\nhost = \"data.example.test\"\nports = [{p}]\n\
         [[rules]]\nhost = \"127.0.0.1\"\nports = [{p}]\n"
    );
    let proxy = ProxyServer::start(Proxy::new(policy(&text)), "t").await;
    let code = format!(
        r#"
import requests
try:
    r = requests.get("https://data.example.test:{p}/big?n=8000000", timeout=30)
    print("got", len(r.content))
except requests.exceptions.RequestException as e:
    print("cut", type(e).__name__)
try:
    requests.get("https://data.example.test:{p}/x.csv", timeout=30)
    print("second REACHED")
except requests.exceptions.ProxyError as e:
    print("second", e)
"#
    );
    let (ok, out, err) = python(&code, &proxy.url(), &up.ca).await;
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("cut "), "{out}");
    assert!(
        out.contains(&format!("429 Too Many Requests (egress: data.example.test:{p} limit: 1048576 bytes received per run)")),
        "{out}"
    );
    assert_eq!(proxy.scope.spent().1, 1 << 20);
}

#[tokio::test]
async fn connections_per_second_per_tenant() {
    let (port, server) = holder().await;
    let proxy = Proxy::new(policy(&rules_for(port, "connections_per_second = 1")));
    // Two runs of one tenant share its rate; another tenant has its own. (Bursts: the
    // unit test of `Rate`.)
    let a1 = ProxyServer::start(proxy.clone(), "a").await;
    let a2 = ProxyServer::start(proxy.clone(), "a").await;
    let b = ProxyServer::start(proxy, "b").await;
    let target = format!("127.0.0.1:{port}");
    let t0 = Instant::now();
    let (s1, _, _k1) = connect(a1.addr, &target).await;
    let (s2, text, _) = connect(a2.addr, &target).await;
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    assert_eq!((s1, s2), (200, 429), "{text}");
    assert!(
        text.contains("limit: 1 new connections per second per tenant"),
        "{text}"
    );
    assert!(text.contains("`connections_per_second`"), "{text}");
    assert_eq!(connect(b.addr, &target).await.0, 200);
    // A second later the bucket has refilled.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(connect(a2.addr, &target).await.0, 200);
    server.abort();
}

#[tokio::test]
async fn connect_timeout() {
    // A listener whose accept queue is full: the kernel drops further SYNs, so a connect
    // hangs (no reset, no answer).
    let sock = TcpSocket::new_v4().unwrap();
    sock.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let l = sock.listen(1).unwrap();
    let addr = l.local_addr().unwrap();
    let mut filling = Vec::new();
    let mut full = false;
    for _ in 0..64 {
        match tokio::time::timeout(Duration::from_millis(300), TcpStream::connect(addr)).await {
            Ok(Ok(s)) => filling.push(s),
            Ok(Err(e)) => panic!("connect: {e}"),
            Err(_) => {
                full = true;
                break;
            }
        }
    }
    assert!(full, "the listener's queue never filled");
    let proxy = ProxyServer::start(
        Proxy::new(policy(&rules_for(addr.port(), "connect_timeout_s = 0.5"))),
        "t",
    )
    .await;
    let t0 = Instant::now();
    let (status, text, _) = connect(proxy.addr, &addr.to_string()).await;
    assert_eq!(status, 504, "{text}");
    assert!(text.contains("connect timeout"), "{text}");
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    drop(l);
}

#[tokio::test]
async fn idle_timeout_closes_a_quiet_tunnel() {
    let (port, server) = holder().await;
    let proxy = ProxyServer::start(
        Proxy::new(policy(&rules_for(port, "idle_timeout_s = 0.5"))),
        "t",
    )
    .await;
    let (status, _, mut s) = connect(proxy.addr, &format!("127.0.0.1:{port}")).await;
    assert_eq!(status, 200);
    // The start of a TLS ClientHello, then nothing.
    s.write_all(&[0x16, 0x03, 0x01]).await.unwrap();
    let t0 = Instant::now();
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
        .await
        .expect("the proxy closes an idle tunnel")
        .unwrap_or(0);
    assert_eq!(n, 0);
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_secs(5),
        "{took:?}"
    );
    // A client that opens a connection and says nothing is closed too.
    let mut quiet = TcpStream::connect(proxy.addr).await.unwrap();
    let n = tokio::time::timeout(Duration::from_secs(10), quiet.read(&mut buf))
        .await
        .expect("the proxy closes a connection that sends no request")
        .unwrap_or(0);
    assert!(
        n == 0 || String::from_utf8_lossy(&buf[..n]).contains("408"),
        "{n}"
    );
    server.abort();
}

fn rss() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap()
        * 1024
}

/// A plain HTTP server that answers one request with `n` bytes as fast as it can.
async fn firehose(n: u64) -> (u16, tokio::task::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {n}\r\n\r\n");
                if s.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let chunk = vec![b'x'; 256 << 10];
                let mut left = n;
                while left > 0 {
                    let k = left.min(chunk.len() as u64) as usize;
                    if s.write_all(&chunk[..k]).await.is_err() {
                        return;
                    }
                    left -= k as u64;
                }
            });
        }
    });
    (port, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_stays_bounded_while_a_fast_upstream_floods_a_slow_reader() {
    const SIZE: u64 = 512 << 20;
    let (port, server) = firehose(SIZE).await;
    let proxy = ProxyServer::start(
        Proxy::new(policy(&rules_for(port, "bytes_down = \"2g\""))),
        "t",
    )
    .await;
    let before = rss();
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    s.write_all(format!("GET http://127.0.0.1:{port}/ HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    // Slow first: 2 s reading almost nothing while the upstream could send at full speed.
    let mut buf = vec![0u8; 64 << 10];
    let mut got = 0u64;
    let mut peak = before;
    for _ in 0..20 {
        got += s.read(&mut buf[..1024]).await.unwrap() as u64;
        tokio::time::sleep(Duration::from_millis(100)).await;
        peak = peak.max(rss());
    }
    // Then fast, to the end.
    let t0 = Instant::now();
    let start = got;
    let deadline = Instant::now() + Duration::from_secs(240);
    let mut n_reads = 0u64;
    loop {
        let n = tokio::time::timeout(Duration::from_secs(30), s.read(&mut buf))
            .await
            .expect("the download keeps coming")
            .unwrap();
        if n == 0 {
            break;
        }
        got += n as u64;
        n_reads += 1;
        if n_reads.is_multiple_of(1024) {
            peak = peak.max(rss());
        }
        if got >= SIZE || Instant::now() > deadline {
            break;
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    assert!(got >= SIZE, "got {got} of {SIZE} bytes");
    let grew = peak.saturating_sub(before);
    eprintln!(
        "egress: {} MiB through the proxy at {:.0} MiB/s (debug build), RSS grew {} MiB at most",
        got >> 20,
        (got - start) as f64 / secs / (1 << 20) as f64,
        grew >> 20
    );
    // A proxy that buffered would hold most of the 512 MiB the upstream can send during the
    // slow phase; the bound leaves room for a test running beside this one in the process.
    assert!(grew < 128 << 20, "RSS grew by {} MiB", grew >> 20);
    server.abort();
}

#[tokio::test]
async fn a_refused_plain_request_and_the_proxys_added_latency() {
    let (port, _, server) = http_server("127.0.0.1:0".parse().unwrap(), "ok").await;
    let proxy = ProxyServer::start(
        Proxy::new(policy(&rules_for(port, "connections_per_second = 1000"))),
        "t",
    )
    .await;
    let get = |via_proxy: bool| async move {
        let t0 = Instant::now();
        let target: SocketAddr = if via_proxy {
            proxy.addr
        } else {
            SocketAddr::from(([127, 0, 0, 1], port))
        };
        let mut s = TcpStream::connect(target).await.unwrap();
        s.write_all(
            format!("GET http://127.0.0.1:{port}/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
        let (status, _) = read_answer(&mut s).await;
        assert_eq!(status, 200);
        t0.elapsed()
    };
    let mut direct = Vec::new();
    let mut proxied = Vec::new();
    for _ in 0..40 {
        direct.push(get(false).await);
        proxied.push(get(true).await);
    }
    direct.sort();
    proxied.sort();
    let q = |v: &[Duration], p: f64| v[((v.len() - 1) as f64 * p) as usize];
    eprintln!(
        "egress: fresh plain GET on loopback (debug build), direct p50 {:?} p95 {:?}, through the proxy p50 {:?} p95 {:?}",
        q(&direct, 0.5),
        q(&direct, 0.95),
        q(&proxied, 0.5),
        q(&proxied, 0.95)
    );
    // A port the rule does not name, in absolute form.
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    s.write_all(
        format!(
            "GET http://127.0.0.1:{}/ HTTP/1.1\r\nHost: x\r\n\r\n",
            port.wrapping_add(1).max(1)
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let (status, text) = read_answer(&mut s).await;
    assert_eq!(status, 403, "{text}");
    assert!(text.contains("not in the policy"), "{text}");
    // An origin-form request: not a proxy request.
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let (status, text) = read_answer(&mut s).await;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("this is a proxy"), "{text}");
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_stays_bounded_while_100_connections_trickle() {
    // An upstream that sends one byte every 50 ms on each connection, for 3 s.
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let server = tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 60\r\n\r\n")
                    .await;
                for _ in 0..60 {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    if s.write_all(b"x").await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let proxy = ProxyServer::start(
        Proxy::new(policy(&rules_for(
            port,
            "connections_in_flight = 128\nconnections_per_second = 1000",
        ))),
        "t",
    )
    .await;
    let before = rss();
    let mut clients = Vec::new();
    for _ in 0..100 {
        let addr = proxy.addr;
        clients.push(tokio::spawn(async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(
                format!("GET http://127.0.0.1:{port}/ HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(),
            )
            .await
            .unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 1024];
            while !got.ends_with(&[b'x'; 60]) {
                let n = tokio::time::timeout(Duration::from_secs(20), s.read(&mut buf))
                    .await
                    .expect("the trickle keeps coming")
                    .unwrap();
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            got.ends_with(&[b'x'; 60])
        }));
    }
    let mut peak = before;
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        peak = peak.max(rss());
    }
    let mut complete = 0;
    for c in clients {
        complete += c.await.unwrap() as usize;
    }
    assert_eq!(complete, 100, "every trickle arrived whole");
    let grew = peak.saturating_sub(before);
    eprintln!(
        "egress: 100 trickling connections through the proxy, RSS grew {} KiB at most",
        grew >> 10
    );
    // Buffers of a megabyte per connection would be 100 MiB.
    assert!(grew < 48 << 20, "RSS grew by {} MiB", grew >> 20);
    server.abort();
}

#[tokio::test]
async fn a_fresh_https_get_through_the_proxy_and_without() {
    let up = TlsUpstream::start(&["data.example.test", "localhost"]).await;
    let p = up.port;
    let text = format!(
        "[limits]\nconnections_per_second = 1000\n[resolve]\n\"data.example.test\" = \"127.0.0.1\"\n\
         [[rules]]\nhost = \"data.example.test\"\nports = [{p}]\n\
         [[rules]]\nhost = \"127.0.0.1\"\nports = [{p}]\n"
    );
    let proxy = ProxyServer::start(Proxy::new(policy(&text)), "t").await;
    // Alternating rounds, a new session (so a new connection and TLS handshake) each time.
    let code = format!(
        r#"
import requests, time
def get(url, proxies):
    t = time.perf_counter()
    with requests.Session() as s:
        s.trust_env = False
        r = s.get(url, proxies=proxies, verify="{ca}", timeout=20)
        assert r.text.startswith("a,b"), r.text
    return (time.perf_counter() - t) * 1000
direct, proxied = [], []
for _ in range(40):
    direct.append(get("https://localhost:{p}/x.csv", None))
    proxied.append(get("https://data.example.test:{p}/x.csv", {{"https": "{proxy}"}}))
q = lambda v, f: sorted(v)[int((len(v) - 1) * f)]
print("direct %.2f %.2f proxied %.2f %.2f" % (q(direct, .5), q(direct, .95), q(proxied, .5), q(proxied, .95)))
"#,
        ca = up.ca.display(),
        proxy = proxy.url()
    );
    let (ok, out, err) = python(&code, &proxy.url(), &up.ca).await;
    assert!(ok, "{out}\n{err}");
    let v: Vec<f64> = out
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    assert_eq!(v.len(), 4, "{out}");
    eprintln!(
        "egress: fresh HTTPS GET from requests (debug build), direct p50 {:.2} ms p95 {:.2} ms, through the proxy p50 {:.2} ms p95 {:.2} ms: added p50 {:.2} ms",
        v[0], v[1], v[2], v[3], v[2] - v[0]
    );
}
