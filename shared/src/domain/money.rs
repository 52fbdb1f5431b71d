//! Money is an integer amount in the currency's minor unit (cents, fen…)
//! with an ISO 4217 code. There is no floating point anywhere in the model.

use serde::{Deserialize, Serialize};
use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidMoney(pub String);

/// An ISO 4217 alphabetic code: three upper-case ASCII letters.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Currency(String);

impl Currency {
    pub fn parse(s: impl Into<String>) -> Result<Self, InvalidMoney> {
        let s = s.into();
        if s.len() == 3 && s.bytes().all(|b| b.is_ascii_uppercase()) {
            Ok(Self(s))
        } else {
            Err(InvalidMoney("currency must be an ISO 4217 code of three upper-case letters, e.g. \"EUR\"".into()))
        }
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}
impl TryFrom<String> for Currency {
    type Error = InvalidMoney;
    fn try_from(s: String) -> Result<Self, InvalidMoney> {
        Self::parse(s)
    }
}
impl From<Currency> for String {
    fn from(c: Currency) -> String {
        c.0
    }
}
impl fmt::Display for Currency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The largest amount one order line or order may carry: far above any real
/// basket, far below where `i64` arithmetic could overflow.
pub const MAX_AMOUNT: i64 = 1_000_000_000_000;

/// `qty × unit_price`, refusing negative prices and totals beyond [`MAX_AMOUNT`].
pub fn line_total(qty: u32, unit_price: i64) -> Result<i64, InvalidMoney> {
    if unit_price < 0 {
        return Err(InvalidMoney("unit_price must not be negative".into()));
    }
    i64::from(qty)
        .checked_mul(unit_price)
        .filter(|t| *t <= MAX_AMOUNT)
        .ok_or_else(|| InvalidMoney("line total is too large".into()))
}

/// A catalog price: what one unit of a SKU costs, in minor units of its
/// currency. Bounded like an order line's price (`0..=MAX_AMOUNT`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Price {
    pub amount: i64,
    pub currency: Currency,
}

impl Price {
    pub fn new(amount: i64, currency: Currency) -> Result<Self, InvalidMoney> {
        if !(0..=MAX_AMOUNT).contains(&amount) {
            return Err(InvalidMoney(format!("price must be an integer from 0 to {MAX_AMOUNT} in minor units")));
        }
        Ok(Self { amount, currency })
    }
}

impl fmt::Display for Price {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.amount, self.currency)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn currency_must_be_three_upper_case_letters() {
        assert!(Currency::parse("EUR").is_ok());
        assert!(Currency::parse("eur").is_err());
        assert!(Currency::parse("EURO").is_err());
    }

    #[test]
    fn line_totals_refuse_negative_and_overflowing_amounts() {
        assert_eq!(line_total(3, 250), Ok(750));
        assert!(line_total(1, -1).is_err());
        assert!(line_total(u32::MAX, i64::MAX / 2).is_err());
    }
}
