//! `healthcheck`: one plain HTTP/1.1 GET, for container health checks where no curl is
//! installed (the server image). Only `http://host[:port]/path`; 3 s in all.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long the whole check may take.
pub const TIMEOUT: Duration = Duration::from_secs(3);

/// GET `url`; `Ok` with the status line when the answer is 2xx, else why not.
pub async fn check(url: &str) -> Result<String, String> {
    tokio::time::timeout(TIMEOUT, get(url))
        .await
        .map_err(|_| format!("no answer within {} s", TIMEOUT.as_secs()))?
}

/// Host, port and path of an `http://` URL.
pub fn parse(url: &str) -> Result<(String, u16, String), String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("`{url}`: only http:// URLs are checked"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || authority.starts_with('[') => (
            h,
            p.parse::<u16>()
                .map_err(|_| format!("`{url}`: bad port `{p}`"))?,
        ),
        _ => (authority, 80),
    };
    if host.is_empty() {
        return Err(format!("`{url}`: no host"));
    }
    Ok((
        host.trim_start_matches('[')
            .trim_end_matches(']')
            .to_string(),
        port,
        path.to_string(),
    ))
}

async fn get(url: &str) -> Result<String, String> {
    let (host, port, path) = parse(url)?;
    let mut stream = tokio::net::TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| format!("cannot connect: {e}"))?;
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| format!("cannot send: {e}"))?;
    let mut head = vec![0u8; 256];
    let n = stream
        .read(&mut head)
        .await
        .map_err(|e| format!("cannot read: {e}"))?;
    let text = String::from_utf8_lossy(&head[..n]);
    let status_line = text.lines().next().unwrap_or("").to_string();
    let code = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse::<u16>().ok())
        .ok_or_else(|| format!("not an HTTP answer: `{status_line}`"))?;
    if (200..300).contains(&code) {
        Ok(status_line)
    } else {
        Err(status_line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            parse("http://127.0.0.1:4000/healthz").unwrap(),
            ("127.0.0.1".into(), 4000, "/healthz".into())
        );
        assert_eq!(
            parse("http://localhost").unwrap(),
            ("localhost".into(), 80, "/".into())
        );
        assert_eq!(
            parse("http://[::1]:8080/x").unwrap(),
            ("::1".into(), 8080, "/x".into())
        );
        assert!(parse("https://x/").is_err());
        assert!(parse("http://x:port/").is_err());
        assert!(parse("http:///x").is_err());
    }

    #[tokio::test]
    async fn answers_and_refusals() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            for answer in [
                "HTTP/1.1 200 OK\r\n\r\nok",
                "HTTP/1.1 503 Service Unavailable\r\n\r\n",
            ] {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = [0u8; 512];
                let _ = s.read(&mut buf).await.unwrap();
                s.write_all(answer.as_bytes()).await.unwrap();
            }
        });
        let url = format!("http://127.0.0.1:{port}/healthz");
        assert_eq!(check(&url).await.unwrap(), "HTTP/1.1 200 OK");
        assert!(check(&url).await.unwrap_err().contains("503"));
        server.await.unwrap();
        // Nobody listens any more.
        assert!(check(&url).await.unwrap_err().contains("cannot connect"));
    }
}
