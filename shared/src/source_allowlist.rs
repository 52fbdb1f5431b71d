//! The source addresses a provider's notifications may come from, checked
//! before anything else the webhook does (docs/payments.md, "Notification
//! flood capacity").
//!
//! HTTP APIs can carry neither AWS WAF nor a resource policy, so an address
//! filter can only live in the function. It does not spare the API's
//! throttle (a refused request has already been counted there); what it
//! spares is the function's time: a request from outside the list is
//! refused from the request context's `sourceIp`, before the body is
//! measured, hashed or parsed. Where the provider publishes its addresses
//! (Stripe: <https://stripe.com/files/ips/ips_webhooks.json>) the deployer
//! lists them in the template parameter `WebhookSourceCidrs`; empty turns
//! the check off, which is the default because a provider may change its
//! addresses without notice and a stale list refuses every notification.

use std::net::IpAddr;

/// One `address/prefix` block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Block {
    net: IpAddr,
    prefix: u8,
}

impl Block {
    fn contains(&self, ip: IpAddr) -> bool {
        match (self.net, normalise(ip)) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.prefix)).unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(self.prefix)).unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// An IPv4 address written as IPv6 (`::ffff:a.b.c.d`) is compared as IPv4.
fn normalise(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

/// The allowed blocks; empty allows every source.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SourceAllowlist {
    blocks: Vec<Block>,
}

impl SourceAllowlist {
    /// Parses a comma-separated list of `address/prefix` blocks (a bare
    /// address is a single host). Blank means "every source". Any malformed
    /// entry fails the whole list: a typo must stop the cold start, not
    /// quietly refuse (or admit) the provider.
    pub fn parse(list: &str) -> Result<Self, String> {
        let mut blocks = Vec::new();
        for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (addr, prefix) = entry.split_once('/').unwrap_or((entry, ""));
            let net: IpAddr = addr.parse().map_err(|_| format!("{entry:?} is not an IP address or CIDR block"))?;
            let net = normalise(net);
            let max = if net.is_ipv4() { 32 } else { 128 };
            let prefix = if prefix.is_empty() {
                max
            } else {
                prefix
                    .parse::<u8>()
                    .ok()
                    .filter(|p| *p <= max)
                    .ok_or_else(|| format!("{entry:?}: bad prefix length"))?
            };
            blocks.push(Block { net, prefix });
        }
        Ok(Self { blocks })
    }

    /// True when the list is empty (the check is off).
    pub fn is_open(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Whether a request from `source` (the request context's `sourceIp`,
    /// `None` when the context has none) may go on. With a list set, an
    /// unknown or unparsable source is refused.
    pub fn allows(&self, source: Option<&str>) -> bool {
        if self.is_open() {
            return true;
        }
        match source.and_then(|s| s.trim().parse::<IpAddr>().ok()) {
            Some(ip) => self.blocks.iter().any(|b| b.contains(ip)),
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_list_lets_every_source_through() {
        let open = SourceAllowlist::parse(" , ").unwrap();
        assert!(open.is_open());
        assert!(open.allows(Some("203.0.113.9")));
        assert!(open.allows(None));
    }

    #[test]
    fn a_list_admits_its_blocks_and_refuses_the_rest() {
        let list = SourceAllowlist::parse("3.18.12.63, 198.51.100.0/24,2001:db8::/32").unwrap();
        assert!(list.allows(Some("3.18.12.63")));
        assert!(!list.allows(Some("3.18.12.64")));
        assert!(list.allows(Some("198.51.100.200")));
        assert!(!list.allows(Some("198.51.101.1")));
        assert!(list.allows(Some("::ffff:198.51.100.7")), "an IPv4-mapped address is its IPv4 address");
        assert!(list.allows(Some("2001:db8:1::5")));
        assert!(!list.allows(Some("2001:db9::5")));
        assert!(!list.allows(None), "no source address: refused");
        assert!(!list.allows(Some("not-an-ip")));
    }

    #[test]
    fn prefix_zero_admits_everything_of_its_family() {
        let list = SourceAllowlist::parse("0.0.0.0/0").unwrap();
        assert!(list.allows(Some("192.0.2.1")));
        assert!(!list.allows(Some("2001:db8::1")));
    }

    #[test]
    fn a_malformed_entry_fails_the_whole_list() {
        for bad in ["3.18.12.63/33", "3.18.12", "example.com", "2001:db8::/129", "1.2.3.4/x"] {
            assert!(SourceAllowlist::parse(bad).is_err(), "{bad} must be refused");
        }
    }
}
