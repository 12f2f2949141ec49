//! What kind of address a connection would reach: the ranges egress refuses whatever a
//! name resolves to (loopback, private, link-local with the cloud metadata endpoint,
//! CGNAT, multicast, unspecified, broadcast), seen through the IPv6 forms that carry an
//! IPv4 address (mapped `::ffff:a.b.c.d`, compatible `::a.b.c.d`, NAT64 `64:ff9b::/96`,
//! 6to4 `2002::/16`). Pure functions; and [`Cidr`], the address ranges a rule may name.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The class of an address, as egress sees it: [`Class::Public`] is reached when a rule
/// allows the name; every other class only when a rule names the address (or a range
/// holding it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    Public,
    /// 127.0.0.0/8, ::1.
    Loopback,
    /// RFC 1918 (10/8, 172.16/12, 192.168/16), ULA fc00::/7, site-local fec0::/10.
    Private,
    /// 169.254.0.0/16 (the cloud metadata endpoint 169.254.169.254), fe80::/10.
    LinkLocal,
    /// Carrier-grade NAT, 100.64.0.0/10 (RFC 6598).
    Cgnat,
    /// 224.0.0.0/4, ff00::/8.
    Multicast,
    /// 0.0.0.0/8 ("this network"), ::.
    Unspecified,
    /// 255.255.255.255.
    Broadcast,
}

impl Class {
    /// As refusals and docs say it ("a private address").
    pub fn describe(self) -> &'static str {
        match self {
            Class::Public => "a public address",
            Class::Loopback => "a loopback address",
            Class::Private => "a private address",
            Class::LinkLocal => "a link-local address (the cloud metadata endpoint's range)",
            Class::Cgnat => "a carrier-grade NAT address",
            Class::Multicast => "a multicast address",
            Class::Unspecified => "an unspecified address",
            Class::Broadcast => "a broadcast address",
        }
    }
}

/// The class of `ip`. An IPv6 address that carries an IPv4 address is classed by that
/// IPv4 address (so `::ffff:127.0.0.1` is loopback).
pub fn classify(ip: IpAddr) -> Class {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => match embedded_v4(v6) {
            Some(v4) => classify_v4(v4),
            None => classify_v6(v6),
        },
    }
}

fn classify_v4(ip: Ipv4Addr) -> Class {
    let [a, b, ..] = ip.octets();
    if ip.is_loopback() {
        Class::Loopback
    } else if ip.is_private() {
        Class::Private
    } else if ip.is_link_local() {
        Class::LinkLocal
    } else if a == 100 && (b & 0xc0) == 64 {
        Class::Cgnat
    } else if ip.is_multicast() {
        Class::Multicast
    } else if a == 0 {
        Class::Unspecified
    } else if ip.is_broadcast() {
        Class::Broadcast
    } else {
        Class::Public
    }
}

fn classify_v6(ip: Ipv6Addr) -> Class {
    let first = ip.segments()[0];
    if ip.is_loopback() {
        Class::Loopback
    } else if ip.is_unspecified() {
        Class::Unspecified
    } else if (first & 0xfe00) == 0xfc00 || (first & 0xffc0) == 0xfec0 {
        Class::Private
    } else if (first & 0xffc0) == 0xfe80 {
        Class::LinkLocal
    } else if ip.is_multicast() {
        Class::Multicast
    } else {
        Class::Public
    }
}

/// The IPv4 address an IPv6 address carries, in the forms a resolver or a hostile client
/// may hand over: mapped `::ffff:0:0/96`, compatible `::/96` (but not `::` and `::1`
/// themselves), NAT64 `64:ff9b::/96`, 6to4 `2002::/16`.
pub fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let low = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    if s[..5] == [0; 5] && s[5] == 0xffff {
        return Some(low);
    }
    if s[..6] == [0; 6] && !(s[6] == 0 && s[7] <= 1) {
        return Some(low);
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return Some(low);
    }
    if s[0] == 0x2002 {
        return Some(Ipv4Addr::new(
            (s[1] >> 8) as u8,
            s[1] as u8,
            (s[2] >> 8) as u8,
            s[2] as u8,
        ));
    }
    None
}

/// `ip` with a mapped or compatible IPv6 form of an IPv4 address taken as that address,
/// so that a rule naming `127.0.0.1` also names `::ffff:127.0.0.1` (the same socket).
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

/// An address range a rule names: `10.0.0.0/8`, `fc00::/7`, or one address (`/32`,
/// `/128`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// `a.b.c.d`, `a.b.c.d/n`, `v6`, `v6/n` (a bracketed `[v6]` too). Bits set past the
    /// prefix are an error: `10.0.0.1/8` is more likely a typo than a wish.
    pub fn parse(s: &str) -> Result<Cidr, String> {
        let (a, p) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let a = a.trim_start_matches('[').trim_end_matches(']');
        let addr: IpAddr = a
            .parse()
            .map_err(|_| format!("`{s}` is not an IP address or a CIDR range"))?;
        let addr = canonical(addr);
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            None => max,
            Some(p) => match p.parse::<u8>() {
                Ok(n) if n <= max => n,
                _ => return Err(format!("`{s}`: the prefix length must be 0 to {max}")),
            },
        };
        let c = Cidr { addr, prefix };
        if c.network() != addr {
            return Err(format!(
                "`{s}` has bits set past its /{prefix} prefix (the range is {}/{prefix})",
                c.network()
            ));
        }
        Ok(c)
    }

    /// Whether `ip` (canonical: a mapped IPv4 address is that IPv4 address) is in range.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, canonical(ip)) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                mask128(u32::from(a) as u128, self.prefix, 32) == u32::from(n) as u128
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => mask128(u128::from(a), self.prefix, 128) == n.into(),
            _ => false,
        }
    }

    /// One address, not a range.
    pub fn single(&self) -> Option<IpAddr> {
        let max = if self.addr.is_ipv4() { 32 } else { 128 };
        (self.prefix == max).then_some(self.addr)
    }

    fn network(&self) -> IpAddr {
        match self.addr {
            IpAddr::V4(a) => {
                IpAddr::V4(Ipv4Addr::from(
                    mask128(u32::from(a) as u128, self.prefix, 32) as u32,
                ))
            }
            IpAddr::V6(a) => IpAddr::V6(Ipv6Addr::from(mask128(u128::from(a), self.prefix, 128))),
        }
    }
}

/// `v` (a `width`-bit number) with only its first `prefix` bits kept.
fn mask128(v: u128, prefix: u8, width: u32) -> u128 {
    let host_bits = width - prefix as u32;
    if host_bits >= 128 {
        0
    } else {
        (v >> host_bits) << host_bits
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.single() {
            Some(a) => write!(f, "{a}"),
            None => write!(f, "{}/{}", self.addr, self.prefix),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(s: &str) -> Class {
        classify(s.parse().unwrap())
    }

    #[test]
    fn classes_of_addresses() {
        for (a, want) in [
            ("127.0.0.1", Class::Loopback),
            ("127.255.0.9", Class::Loopback),
            ("::1", Class::Loopback),
            ("10.1.2.3", Class::Private),
            ("172.16.0.1", Class::Private),
            ("172.31.255.255", Class::Private),
            ("172.32.0.1", Class::Public),
            ("192.168.1.1", Class::Private),
            ("fc00::1", Class::Private),
            ("fd12:3456::1", Class::Private),
            ("fec0::1", Class::Private),
            ("169.254.169.254", Class::LinkLocal),
            ("fe80::1", Class::LinkLocal),
            ("febf::1", Class::LinkLocal),
            ("100.64.0.1", Class::Cgnat),
            ("100.127.255.255", Class::Cgnat),
            ("100.128.0.1", Class::Public),
            ("100.63.255.255", Class::Public),
            ("224.0.0.1", Class::Multicast),
            ("239.255.255.250", Class::Multicast),
            ("ff02::1", Class::Multicast),
            ("0.0.0.0", Class::Unspecified),
            ("0.1.2.3", Class::Unspecified),
            ("::", Class::Unspecified),
            ("255.255.255.255", Class::Broadcast),
            ("93.184.216.34", Class::Public),
            ("2606:4700::1111", Class::Public),
            // IPv6 forms that carry an IPv4 address are that address.
            ("::ffff:127.0.0.1", Class::Loopback),
            ("::ffff:10.0.0.1", Class::Private),
            ("::ffff:169.254.169.254", Class::LinkLocal),
            ("::ffff:100.64.0.1", Class::Cgnat),
            ("::ffff:0.0.0.0", Class::Unspecified),
            ("::127.0.0.1", Class::Loopback),
            ("::10.0.0.1", Class::Private),
            ("64:ff9b::a9fe:a9fe", Class::LinkLocal),
            ("64:ff9b::7f00:1", Class::Loopback),
            ("2002:7f00:1::1", Class::Loopback),
            ("2002:a00:1::", Class::Private),
            ("::ffff:93.184.216.34", Class::Public),
        ] {
            assert_eq!(c(a), want, "{a}");
        }
    }

    #[test]
    fn ranges_parse_match_and_refuse_typos() {
        let r = Cidr::parse("10.0.0.0/8").unwrap();
        assert!(r.contains("10.255.1.2".parse().unwrap()));
        assert!(r.contains("::ffff:10.1.1.1".parse().unwrap()));
        assert!(!r.contains("11.0.0.1".parse().unwrap()));
        assert!(!r.contains("fc00::1".parse().unwrap()));
        let one = Cidr::parse("127.0.0.1").unwrap();
        assert_eq!(one.single(), Some("127.0.0.1".parse().unwrap()));
        assert!(one.contains("::ffff:127.0.0.1".parse().unwrap()));
        assert!(!one.contains("127.0.0.2".parse().unwrap()));
        assert_eq!(one.to_string(), "127.0.0.1");
        let v6 = Cidr::parse("fc00::/7").unwrap();
        assert!(v6.contains("fdff::1".parse().unwrap()));
        assert!(!v6.contains("fe00::1".parse().unwrap()));
        assert_eq!(v6.to_string(), "fc00::/7");
        assert!(Cidr::parse("[::1]")
            .unwrap()
            .contains("::1".parse().unwrap()));
        assert!(Cidr::parse("0.0.0.0/0")
            .unwrap()
            .contains("8.8.8.8".parse().unwrap()));
        assert!(Cidr::parse("::/0")
            .unwrap()
            .contains("::1".parse().unwrap()));
        for bad in [
            "10.0.0.1/8",
            "10.0.0.0/33",
            "fc00::/129",
            "example.com",
            "10.0.0.0/x",
        ] {
            assert!(Cidr::parse(bad).is_err(), "{bad}");
        }
    }
}
