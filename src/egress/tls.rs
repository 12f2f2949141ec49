//! The first record of a tunnel: it must be a TLS ClientHello, and the server name it
//! asks for (SNI), when it names one, must be the host the tunnel was opened to. A tunnel
//! to an allowed host's address that asks that address for another name (domain fronting
//! on a shared front end) is cut before a byte reaches upstream. Pure parsing.

/// Bytes of a TLS record header.
pub const HEADER: usize = 5;
/// The largest record a ClientHello may come in (2^14 plus room for what TLS 1.2 allows).
pub const MAX_RECORD: usize = (1 << 14) + 2048;

/// What the first bytes of a tunnel are.
#[derive(Debug, PartialEq, Eq)]
pub enum Hello {
    /// Not a TLS handshake record.
    NotTls,
    /// A whole record is `n` bytes (more than have arrived): read until there are that
    /// many.
    Need(usize),
    /// A ClientHello with this server name (lower case), or none.
    ServerName(Option<String>),
}

/// Look at the first bytes of a tunnel (`buf`: what has arrived so far).
pub fn client_hello(buf: &[u8]) -> Hello {
    if buf.is_empty() {
        return Hello::Need(HEADER);
    }
    if buf[0] != 0x16 || (buf.len() >= 2 && buf[1] != 0x03) {
        return Hello::NotTls;
    }
    if buf.len() < HEADER {
        return Hello::Need(HEADER);
    }
    let len = u16::from_be_bytes([buf[3], buf[4]]) as usize;
    if len > MAX_RECORD {
        return Hello::NotTls;
    }
    if buf.len() < HEADER + len {
        return Hello::Need(HEADER + len);
    }
    match server_name(&buf[HEADER..HEADER + len]) {
        Some(sni) => Hello::ServerName(sni),
        None => Hello::NotTls,
    }
}

/// The server name of a ClientHello handshake message; `None` when it is not one or does
/// not fit in the record (a fragmented ClientHello is refused rather than let through
/// unchecked); `Some(None)` when it names no server.
fn server_name(msg: &[u8]) -> Option<Option<String>> {
    let mut r = Reader(msg);
    if r.u8()? != 1 {
        return None;
    }
    let len = r.u24()?;
    let mut r = Reader(r.take(len)?);
    r.take(2 + 32)?; // version, random
    let n = r.u8()? as usize;
    r.take(n)?; // session id
    let n = r.u16()? as usize;
    r.take(n)?; // cipher suites
    let n = r.u8()? as usize;
    r.take(n)?; // compression methods
    if r.0.is_empty() {
        return Some(None);
    }
    let n = r.u16()? as usize;
    let mut ext = Reader(r.take(n)?);
    while !ext.0.is_empty() {
        let kind = ext.u16()?;
        let n = ext.u16()? as usize;
        let data = ext.take(n)?;
        if kind != 0 {
            continue;
        }
        let mut list = Reader(data);
        let n = list.u16()? as usize;
        let mut list = Reader(list.take(n)?);
        while !list.0.is_empty() {
            let name_type = list.u8()?;
            let n = list.u16()? as usize;
            let name = list.take(n)?;
            if name_type == 0 {
                let s = std::str::from_utf8(name).ok()?;
                return Some(Some(s.trim_end_matches('.').to_ascii_lowercase()));
            }
        }
        return Some(None);
    }
    Some(None)
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u16(&mut self) -> Option<u16> {
        let b = self.take(2)?;
        Some(u16::from_be_bytes([b[0], b[1]]))
    }
    fn u24(&mut self) -> Option<usize> {
        let b = self.take(3)?;
        Some(((b[0] as usize) << 16) | ((b[1] as usize) << 8) | b[2] as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ClientHello record, with a server name extension when `sni` is given.
    pub fn hello(sni: Option<&str>) -> Vec<u8> {
        let mut ext = Vec::new();
        if let Some(name) = sni {
            let n = name.len() as u16;
            ext.extend_from_slice(&[0, 0]);
            ext.extend_from_slice(&(n + 5).to_be_bytes());
            ext.extend_from_slice(&(n + 3).to_be_bytes());
            ext.push(0);
            ext.extend_from_slice(&n.to_be_bytes());
            ext.extend_from_slice(name.as_bytes());
        }
        // Another extension before or after does not matter: supported_versions.
        ext.extend_from_slice(&[0, 43, 0, 3, 2, 3, 4]);
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7; 32]);
        body.push(0); // session id
        body.extend_from_slice(&[0, 2, 0x13, 0x01]); // one cipher suite
        body.extend_from_slice(&[1, 0]); // null compression
        body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
        body.extend_from_slice(&ext);
        let mut msg = vec![1];
        msg.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
        msg.extend_from_slice(&body);
        let mut rec = vec![0x16, 3, 1];
        rec.extend_from_slice(&(msg.len() as u16).to_be_bytes());
        rec.extend_from_slice(&msg);
        rec
    }

    #[test]
    fn reads_the_server_name_of_a_client_hello() {
        let h = hello(Some("Data.Example.Test"));
        assert_eq!(
            client_hello(&h),
            Hello::ServerName(Some("data.example.test".into()))
        );
        assert_eq!(client_hello(&hello(None)), Hello::ServerName(None));
        assert_eq!(client_hello(&h[..3]), Hello::Need(HEADER));
        assert_eq!(client_hello(&h[..10]), Hello::Need(h.len()));
        assert_eq!(client_hello(b"SSH-2.0-OpenSSH"), Hello::NotTls);
        assert_eq!(client_hello(b"GET / HTTP/1.1\r\n"), Hello::NotTls);
        assert_eq!(client_hello(&[0x16]), Hello::Need(HEADER));
        assert_eq!(client_hello(&[]), Hello::Need(HEADER));
        // A record that holds only part of the ClientHello is refused.
        let mut cut = h.clone();
        let short = (h.len() - HEADER - 20) as u16;
        cut[3..5].copy_from_slice(&short.to_be_bytes());
        cut.truncate(HEADER + short as usize);
        assert_eq!(client_hello(&cut), Hello::NotTls);
        // Not a ClientHello (a ServerHello, type 2).
        let mut other = h.clone();
        other[HEADER] = 2;
        assert_eq!(client_hello(&other), Hello::NotTls);
    }
}
