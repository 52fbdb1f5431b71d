//! An operator's change of a SKU's stock or price, and its audit record.
//!
//! Orders move units between `available`, `reserved` and `sold` but never
//! create or destroy one, so `available + reserved + sold` of a SKU only
//! changes when an operator changes the supply. Every such change is
//! written together with a [`StockChangeRecord`] (who, when, what, the
//! delta) in one transaction, keyed by the change's idempotency key: a
//! change whose answer was lost, re-sent by the SDK or by the operator,
//! finds its own record and is applied once. The SKU's `supplied` (the sum
//! of the deltas) and `changes` (how many records there are) move by the
//! same amounts in the same write, so reconciliation can check the counts
//! against the records, and the supply before and after each change is
//! the running sum of the history in the order the changes were made.
//!
//! The writes add to `supplied` and `changes` rather than setting them, so
//! concurrent changes of one SKU (and the orders reserving from it) never
//! refuse each other: only a change's own condition can refuse it (a swap's
//! `if_available`, an adjustment's `available + d >= 0`). [`plan`] decides
//! a change from the SKU as read: the record to write, or the refusal.

use super::*;
use serde::{Deserialize, Serialize};

/// What `PUT /admin/skus/{sku}` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StockChange {
    /// `{"available": N, "price": P, "currency": C}`: seed a SKU that does
    /// not exist yet, with its catalog price.
    Seed { available: i64, price: Price },
    /// `{"available": N, "if_available": M}`: compare-and-swap.
    Swap { available: i64, expected: i64 },
    /// `{"adjust": D}`: add D (may be negative) if the result stays >= 0.
    Adjust(i64),
    /// `{"price": P, "currency": C}`: a live SKU's new catalog price. Open
    /// orders keep the price they were created with.
    Reprice(Price),
    /// `{"purchase_limit": N}`: at most N units per buyer from now on,
    /// open and paid orders together (0 lifts the limit). Orders already
    /// placed keep what they hold.
    Limit(u32),
    /// `{"category": C, "tags": [T, …]}`: what expiry rules may match of
    /// the SKU besides its id (either may be sent alone; `null` or `[]`
    /// clears it). Orders already placed keep their window.
    Classify { category: Option<Option<super::expiry_rules::Label>>, tags: Option<Vec<super::expiry_rules::Label>> },
}

impl StockChange {
    /// The request's canonical form: a key used again with another change
    /// is refused, the same change answers as it did the first time.
    pub fn canonical(&self) -> String {
        match self {
            Self::Seed { available, price } => format!("seed available={available} price={price}"),
            Self::Swap { available, expected } => format!("swap available={available} if_available={expected}"),
            Self::Adjust(d) => format!("adjust {d}"),
            Self::Reprice(price) => format!("price {price}"),
            Self::Limit(n) => format!("purchase_limit {n}"),
            Self::Classify { category, tags } => {
                let category = match category {
                    None => "unchanged".to_owned(),
                    Some(None) => "none".to_owned(),
                    Some(Some(c)) => c.to_string(),
                };
                let tags = match tags {
                    None => "unchanged".to_owned(),
                    Some(t) => format!("[{}]", t.iter().map(|t| t.as_str()).collect::<Vec<_>>().join(",")),
                };
                format!("classify category={category} tags={tags}")
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StockChangeKind {
    Seed,
    Swap,
    Adjust,
    Reprice,
    Limit,
    Classify,
}

/// One applied operator change of a SKU (`SKU#<sku>` / `CHANGE#<key>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StockChangeRecord {
    pub sku: Sku,
    /// The request's `Idempotency-Key` (or one made for a request that
    /// came without, which still makes the SDK's own re-sends harmless).
    pub key: IdempotencyKey,
    pub kind: StockChangeKind,
    /// Units added to the supply (negative: removed); 0 for a price.
    pub delta: i64,
    /// On the first recorded change of a SKU seeded before changes were
    /// recorded: its supply until then (`available + reserved + sold`,
    /// which orders never change), where its history starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<i64>,
    /// A swap's (and a seed's) exact `available` before and after. A
    /// relative change has none: orders move `available` concurrently, so
    /// only the delta is exact.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_before: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_after: Option<i64>,
    /// The catalog price a seed or a price change set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price: Option<Price>,
    /// The purchase limit a limit change set (0: lifted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub purchase_limit: Option<u32>,
    /// A classify change's new category (`Some(None)`: cleared) and tags.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<Option<super::expiry_rules::Label>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<Vec<super::expiry_rules::Label>>,
    /// The caller (the IAM identity of the admin route).
    pub by: String,
    pub at: Timestamp,
    /// [`StockChange::canonical`] of the request.
    pub request: String,
}

/// Why a change cannot be made to the SKU as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StockRefusal {
    /// A seed of a SKU that exists.
    Exists { available: i64, reserved: i64 },
    /// A change of a SKU that does not exist.
    Missing,
    /// A swap whose `if_available` is no longer true.
    Changed { available: i64, expected: i64 },
    /// An adjustment that would make `available` negative.
    Insufficient { available: i64, delta: i64 },
}

/// The supply a SKU's record shows: what its audit records must add up to.
pub fn supplied(s: &Stock) -> i64 {
    s.available + s.reserved + s.sold
}

/// Who asks and when, for the record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requested {
    pub key: IdempotencyKey,
    pub by: String,
    pub at: Timestamp,
}

/// The record of `change` applied to `current` (the SKU as read), or why
/// it cannot be.
pub fn plan(
    sku: &Sku,
    change: &StockChange,
    current: Option<&Stock>,
    req: &Requested,
) -> Result<StockChangeRecord, StockRefusal> {
    let record = |kind, delta: i64| StockChangeRecord {
        sku: sku.clone(),
        key: req.key.clone(),
        kind,
        delta,
        baseline: None,
        available_before: None,
        available_after: None,
        price: None,
        purchase_limit: None,
        category: None,
        tags: None,
        by: req.by.clone(),
        at: req.at,
        request: change.canonical(),
    };
    let s = match (change, current) {
        (StockChange::Seed { available, price }, None) => {
            return Ok(StockChangeRecord {
                available_before: Some(0),
                available_after: Some(*available),
                price: Some(price.clone()),
                ..record(StockChangeKind::Seed, *available)
            })
        }
        (StockChange::Seed { .. }, Some(s)) => {
            return Err(StockRefusal::Exists { available: s.available, reserved: s.reserved })
        }
        (_, None) => return Err(StockRefusal::Missing),
        (_, Some(s)) => s,
    };
    let planned = match change {
        StockChange::Seed { .. } => unreachable!("decided above"),
        StockChange::Swap { available, expected } if s.available == *expected => StockChangeRecord {
            available_before: Some(*expected),
            available_after: Some(*available),
            ..record(StockChangeKind::Swap, available - expected)
        },
        StockChange::Swap { expected, .. } => {
            return Err(StockRefusal::Changed { available: s.available, expected: *expected })
        }
        StockChange::Adjust(d) if s.available + d >= 0 => record(StockChangeKind::Adjust, *d),
        StockChange::Adjust(d) => return Err(StockRefusal::Insufficient { available: s.available, delta: *d }),
        StockChange::Reprice(price) => {
            StockChangeRecord { price: Some(price.clone()), ..record(StockChangeKind::Reprice, 0) }
        }
        StockChange::Limit(n) => StockChangeRecord { purchase_limit: Some(*n), ..record(StockChangeKind::Limit, 0) },
        StockChange::Classify { category, tags } => {
            StockChangeRecord { category: category.clone(), tags: tags.clone(), ..record(StockChangeKind::Classify, 0) }
        }
    };
    // A SKU seeded before changes were recorded starts its history here.
    let baseline = (s.changes == 0).then(|| supplied(s));
    Ok(StockChangeRecord { baseline, ..planned })
}

/// A SKU's history in the order its changes were made, each with the
/// supply before and after it (the running sum of the deltas from the
/// history's start).
pub fn with_supply(records: &[StockChangeRecord]) -> Vec<(i64, i64, &StockChangeRecord)> {
    let mut sorted: Vec<&StockChangeRecord> = records.iter().collect();
    sorted.sort_by(|a, b| (a.at, a.key.as_str()).cmp(&(b.at, b.key.as_str())));
    let mut total = 0;
    sorted
        .into_iter()
        .map(|r| {
            let before = r.baseline.unwrap_or(total);
            total = before + r.delta;
            (before, total, r)
        })
        .collect()
}

/// What a SKU's audit records say against its counts: empty when they
/// agree. Each line names one disagreement.
pub fn audit_disagreements(stock: &Stock, records: &[StockChangeRecord]) -> Vec<String> {
    let mut out = Vec::new();
    if records.is_empty() && stock.changes == 0 {
        // Seeded before changes were recorded and never changed since:
        // nothing to compare with.
        return out;
    }
    if records.len() as u64 != stock.changes {
        out.push(format!("changes {} but {} audit records", stock.changes, records.len()));
    }
    let baselines: Vec<i64> = records.iter().filter_map(|r| r.baseline).collect();
    if baselines.len() > 1 {
        out.push(format!("{} records each start the history", baselines.len()));
    }
    let total = baselines.iter().sum::<i64>() + records.iter().map(|r| r.delta).sum::<i64>();
    if stock.supplied != total {
        out.push(format!("supplied {} but the audit records add up to {total}", stock.supplied));
    }
    if supplied(stock) != stock.supplied {
        out.push(format!(
            "available {} + reserved {} + sold {} = {}, not the supplied {}",
            stock.available,
            stock.reserved,
            stock.sold,
            supplied(stock),
            stock.supplied
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eur(amount: i64) -> Price {
        Price { amount, currency: Currency::parse("EUR").unwrap() }
    }

    fn stock(available: i64, reserved: i64, sold: i64, changes: u64) -> Stock {
        Stock {
            sku: Sku::parse("A").unwrap(),
            available,
            reserved,
            sold,
            price: Some(100),
            currency: Some(Currency::parse("EUR").unwrap()),
            supplied: available + reserved + sold,
            changes,
            purchase_limit: None,
            category: None,
            tags: vec![],
        }
    }

    fn sku() -> Sku {
        Sku::parse("A").unwrap()
    }

    fn req() -> Requested {
        Requested { key: IdempotencyKey::parse("k1").unwrap(), by: "ops".into(), at: Timestamp::from_unix_millis(1000) }
    }

    #[test]
    fn a_seed_starts_the_history() {
        let r = plan(&sku(), &StockChange::Seed { available: 5, price: eur(100) }, None, &req()).unwrap();
        assert_eq!((r.kind, r.delta, r.baseline), (StockChangeKind::Seed, 5, None));
        assert_eq!((r.available_before, r.available_after), (Some(0), Some(5)));
        assert_eq!(r.price, Some(eur(100)));
    }

    #[test]
    fn every_change_is_refused_or_planned_from_the_sku_as_read() {
        let s = stock(4, 3, 2, 7);
        let seed = StockChange::Seed { available: 1, price: eur(1) };
        assert_eq!(plan(&sku(), &seed, Some(&s), &req()), Err(StockRefusal::Exists { available: 4, reserved: 3 }));
        for change in
            [StockChange::Swap { available: 1, expected: 4 }, StockChange::Adjust(1), StockChange::Reprice(eur(2))]
        {
            assert_eq!(plan(&sku(), &change, None, &req()), Err(StockRefusal::Missing));
        }
        let swap = plan(&sku(), &StockChange::Swap { available: 10, expected: 4 }, Some(&s), &req()).unwrap();
        assert_eq!((swap.delta, swap.baseline), (6, None));
        assert_eq!((swap.available_before, swap.available_after), (Some(4), Some(10)));
        assert_eq!(
            plan(&sku(), &StockChange::Swap { available: 10, expected: 5 }, Some(&s), &req()),
            Err(StockRefusal::Changed { available: 4, expected: 5 })
        );
        let down = plan(&sku(), &StockChange::Adjust(-4), Some(&s), &req()).unwrap();
        assert_eq!((down.delta, down.available_after), (-4, None));
        assert_eq!(
            plan(&sku(), &StockChange::Adjust(-5), Some(&s), &req()),
            Err(StockRefusal::Insufficient { available: 4, delta: -5 })
        );
        let price = plan(&sku(), &StockChange::Reprice(eur(250)), Some(&s), &req()).unwrap();
        assert_eq!((price.delta, price.price), (0, Some(eur(250))));
        assert_eq!(price.sku, s.sku);
        // A SKU seeded before changes were recorded: its history starts at its counts.
        let legacy = plan(&sku(), &StockChange::Adjust(1), Some(&stock(4, 3, 2, 0)), &req()).unwrap();
        assert_eq!(legacy.baseline, Some(9));
    }

    #[test]
    fn the_canonical_form_tells_changes_apart() {
        let forms: Vec<String> = [
            StockChange::Seed { available: 1, price: eur(1) },
            StockChange::Swap { available: 1, expected: 0 },
            StockChange::Adjust(1),
            StockChange::Adjust(-1),
            StockChange::Reprice(eur(1)),
        ]
        .iter()
        .map(StockChange::canonical)
        .collect();
        let mut unique = forms.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), forms.len(), "{forms:?}");
    }

    #[test]
    fn the_supply_before_and_after_each_change_is_the_running_sum_of_the_history() {
        let at = |ms| Requested { at: Timestamp::from_unix_millis(ms), ..req() };
        let seed = plan(&sku(), &StockChange::Seed { available: 5, price: eur(1) }, None, &at(1)).unwrap();
        let s = stock(5, 0, 0, 1);
        let up = plan(&sku(), &StockChange::Adjust(3), Some(&s), &at(2)).unwrap();
        let down = plan(&sku(), &StockChange::Adjust(-1), Some(&s), &at(3)).unwrap();
        let rows: Vec<(i64, i64)> = with_supply(&[down, seed, up]).iter().map(|(b, a, _)| (*b, *a)).collect();
        assert_eq!(rows, [(0, 5), (5, 8), (8, 7)]);
    }

    #[test]
    fn audit_disagreements_name_each_broken_identity() {
        let seed = plan(&sku(), &StockChange::Seed { available: 5, price: eur(1) }, None, &req()).unwrap();
        let mut s = stock(3, 1, 1, 1);
        assert!(audit_disagreements(&s, std::slice::from_ref(&seed)).is_empty());
        // A unit created from nothing: the counts no longer add up.
        s.available += 1;
        let found = audit_disagreements(&s, std::slice::from_ref(&seed));
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("not the supplied 5"), "{found:?}");
        // A delta applied twice: supplied and the counts agree, the records do not.
        let mut twice = stock(7, 1, 1, 2);
        twice.supplied = 9;
        let adjust = StockChangeRecord { kind: StockChangeKind::Adjust, delta: 2, ..seed.clone() };
        let found = audit_disagreements(&twice, &[seed.clone(), adjust]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("add up to 7"), "{found:?}");
        // A record missing from the history.
        let found = audit_disagreements(&stock(5, 0, 0, 2), std::slice::from_ref(&seed));
        assert!(found.iter().any(|f| f.contains("changes 2 but 1 audit records")), "{found:?}");
        // Seeded before changes were recorded: nothing to say, then its
        // baseline starts the history.
        let mut legacy = stock(5, 0, 0, 0);
        legacy.supplied = 0;
        assert!(audit_disagreements(&legacy, &[]).is_empty());
        let first = plan(&sku(), &StockChange::Adjust(2), Some(&legacy), &req()).unwrap();
        assert!(audit_disagreements(&stock(7, 0, 0, 1), &[first]).is_empty());
    }
}
