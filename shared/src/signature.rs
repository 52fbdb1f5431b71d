//! Webhook signatures: `t=<unix seconds>,v1=<hex>` where the hex is
//! HMAC-SHA256(secret, "<t>.<raw body>") — the sandbox's `X-Signature` and
//! Stripe's `Stripe-Signature` are the same scheme. The timestamp is inside
//! the signed text, so a captured notification cannot be replayed later
//! than the tolerance; the comparison is constant-time. Several `v1` values
//! (the sender signing with an old and a new secret) and several secrets
//! on our side ([`verify_any`]: both while one is rotated) are accepted.

use hmac::{Hmac, Mac};
use sha2::Sha256;

pub const TOLERANCE_SECONDS: i64 = 300;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("the signature header is missing")]
    Missing,
    #[error("the signature header is malformed; expected t=<unix seconds>,v1=<hex>")]
    Malformed,
    #[error("the signature timestamp is outside the 5-minute tolerance")]
    Stale,
    #[error("the signature does not match the body")]
    Mismatch,
}

fn mac(secret: &[u8], t: i64, body: &[u8]) -> Hmac<Sha256> {
    let mut m = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    m.update(t.to_string().as_bytes());
    m.update(b".");
    m.update(body);
    m
}

/// The header value a sender puts on `body` at time `t`.
pub fn sign(secret: &[u8], t: i64, body: &[u8]) -> String {
    format!("t={t},v1={}", hex::encode(mac(secret, t, body).finalize().into_bytes()))
}

/// The most `v1=` values a header may carry: a sender signs with at most
/// two secrets at once (Stripe during an endpoint's secret roll). A header
/// with more is malformed, so junk cannot make one request cost thousands
/// of HMACs over a large body.
pub const MAX_SIGNATURES: usize = 4;
/// The longest header taken (four 64-hex signatures and a timestamp fit).
const MAX_HEADER_BYTES: usize = 512;

/// A header's timestamp and signatures, checked for shape and age.
fn parse(header: Option<&str>, now: i64) -> Result<(i64, Vec<Vec<u8>>), SignatureError> {
    let header = header.ok_or(SignatureError::Missing)?;
    if header.len() > MAX_HEADER_BYTES {
        return Err(SignatureError::Malformed);
    }
    let mut t = None;
    let mut v1 = Vec::new();
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", v)) => t = Some(v.parse::<i64>().map_err(|_| SignatureError::Malformed)?),
            Some(("v1", v)) => v1.push(hex::decode(v).map_err(|_| SignatureError::Malformed)?),
            _ => {}
        }
    }
    let t = t.ok_or(SignatureError::Malformed)?;
    if v1.is_empty() || v1.len() > MAX_SIGNATURES {
        return Err(SignatureError::Malformed);
    }
    if now.abs_diff(t) > TOLERANCE_SECONDS as u64 {
        return Err(SignatureError::Stale);
    }
    Ok((t, v1))
}

/// Constant-time equality of two MACs.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Verifies `header` over the raw `body` at server time `now` (unix seconds).
pub fn verify(secret: &[u8], header: Option<&str>, body: &[u8], now: i64) -> Result<(), SignatureError> {
    verify_any(std::slice::from_ref(&secret.to_vec()), header, body, now)
}

/// Verifies against each of `secrets` (an old and a new one while a secret
/// is rotated): valid if any one matches. With no secret nothing verifies.
/// One HMAC over the body per secret, whatever the header carries.
pub fn verify_any(secrets: &[Vec<u8>], header: Option<&str>, body: &[u8], now: i64) -> Result<(), SignatureError> {
    let (t, signatures) = parse(header, now)?;
    for secret in secrets {
        let expected = mac(secret, t, body).finalize().into_bytes();
        // Several v1 values allow secret rotation: any one may match.
        if signatures.iter().any(|sig| same(&expected, sig)) {
            return Ok(());
        }
    }
    Err(SignatureError::Mismatch)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_verifies_only_for_its_body_secret_and_time() {
        let h = sign(b"k", 1000, b"{}");
        assert_eq!(verify(b"k", Some(&h), b"{}", 1000), Ok(()));
        assert_eq!(verify(b"k", Some(&h), b"{} ", 1000), Err(SignatureError::Mismatch));
        assert_eq!(verify(b"other", Some(&h), b"{}", 1000), Err(SignatureError::Mismatch));
        assert_eq!(verify(b"k", Some(&h), b"{}", 1000 + 301), Err(SignatureError::Stale));
        assert_eq!(verify(b"k", Some(&h), b"{}", 1000 - 301), Err(SignatureError::Stale));
        assert_eq!(verify(b"k", None, b"{}", 1000), Err(SignatureError::Missing));
        assert_eq!(verify(b"k", Some("t=x,v1=00"), b"{}", 1000), Err(SignatureError::Malformed));
        assert_eq!(verify(b"k", Some("t=1000"), b"{}", 1000), Err(SignatureError::Malformed));
        let extreme = format!("t={},v1=00", i64::MIN);
        assert_eq!(verify(b"k", Some(&extreme), b"{}", 1000), Err(SignatureError::Stale));
    }

    #[test]
    fn any_of_two_secrets_verifies_during_a_rotation() {
        let secrets = vec![b"old".to_vec(), b"new".to_vec()];
        for secret in [&b"old"[..], b"new"] {
            assert_eq!(verify_any(&secrets, Some(&sign(secret, 1000, b"x")), b"x", 1000), Ok(()));
        }
        let h = sign(b"other", 1000, b"x");
        assert_eq!(verify_any(&secrets, Some(&h), b"x", 1000), Err(SignatureError::Mismatch));
        assert_eq!(verify_any(&secrets, Some(&sign(b"new", 1, b"x")), b"x", 1000), Err(SignatureError::Stale));
        assert_eq!(verify_any(&[], Some(&sign(b"new", 1000, b"x")), b"x", 1000), Err(SignatureError::Mismatch));
        // A header with two v1 values (Stripe signing with two of its
        // secrets) verifies when either is ours.
        let both = format!("{},v1={}", sign(b"zzz", 1000, b"x"), sign(b"new", 1000, b"x").split("v1=").nth(1).unwrap());
        assert_eq!(verify_any(&secrets, Some(&both), b"x", 1000), Ok(()));
    }

    #[test]
    fn a_header_with_more_signatures_than_a_sender_uses_is_malformed_before_any_hmac() {
        let one = sign(b"k", 1000, b"x");
        let sig = one.split("v1=").nth(1).unwrap();
        let four = format!("t=1000{}", format!(",v1={sig}").repeat(MAX_SIGNATURES));
        assert_eq!(verify(b"k", Some(&four), b"x", 1000), Ok(()));
        let five = format!("t=1000{}", format!(",v1={sig}").repeat(MAX_SIGNATURES + 1));
        assert_eq!(verify(b"k", Some(&five), b"x", 1000), Err(SignatureError::Malformed));
        let junk = format!("t=1000{}", ",v1=".repeat(2000));
        assert_eq!(verify(b"k", Some(&junk), b"x", 1000), Err(SignatureError::Malformed));
    }
}
