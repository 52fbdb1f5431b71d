//! Payment windows by rule (docs/design.md#expiry-fixed-at-create): different
//! products and campaigns get different windows, fixed on the order at create
//! together with the version of the rules that gave it.
//!
//! A rule set is published whole and never changed: each publication is a
//! new version. An order keeps the `expire_at` and `expiry_rule_version` it
//! was created with, so a new version never moves an existing order.
//!
//! **Which window an order gets.** Every rule that matches one of the
//! order's lines (by the line's SKU, the SKU's category, or one of the SKU's
//! tags) is a candidate; the order's window is the *shortest* candidate
//! (a short-window product in a basket keeps the whole basket's stock from
//! being held longer than that product allows). No candidate: the set's
//! `default_seconds`, or, when it has none, the stack's
//! `PaymentWindowSeconds`.

use super::ids::InvalidId;
use super::*;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The shortest and longest window a rule may give.
pub const MIN_WINDOW_SECONDS: u64 = 5;
pub const MAX_WINDOW_SECONDS: u64 = 7 * 24 * 3600;
/// Rules one set may hold.
pub const MAX_RULES: usize = 500;

/// What a rule applies to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleTarget {
    Sku(Sku),
    Category(Label),
    Tag(Label),
}

/// A category or campaign tag: the ids' alphabet, 1 to 64 characters.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Label(String);

impl Label {
    pub fn parse(s: impl Into<String>) -> Result<Self, InvalidId> {
        let s = s.into();
        // The SKU's rules are the ids' own: same alphabet and length.
        Sku::parse(s.clone()).map_err(|e| InvalidId(e.0.replace("sku", "label")))?;
        Ok(Self(s))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for Label {
    type Error = InvalidId;
    fn try_from(s: String) -> Result<Self, InvalidId> {
        Self::parse(s)
    }
}

impl From<Label> for String {
    fn from(l: Label) -> String {
        l.0
    }
}

impl std::fmt::Display for Label {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpiryRule {
    pub applies_to: RuleTarget,
    pub window_seconds: u64,
}

/// One published version of the rules.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpiryRuleSet {
    /// 1, 2, …: one more than the version it replaced.
    pub version: u64,
    /// The window when no rule matches; `None`: the stack's
    /// `PaymentWindowSeconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_seconds: Option<u64>,
    pub rules: Vec<ExpiryRule>,
    pub published_at: Timestamp,
    /// The caller (the IAM identity of the admin route).
    pub published_by: String,
}

impl ExpiryRuleSet {
    /// The name fixed on an order created under this version.
    pub fn version_name(&self) -> String {
        version_name(self.version)
    }
}

/// `rules-v<n>`: what an order created under version `n` records.
pub fn version_name(version: u64) -> String {
    format!("rules-v{version}")
}

/// What a rule can match of one line: its SKU, and the SKU's category and
/// tags as the catalog gives them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineFacts<'a> {
    pub sku: &'a Sku,
    pub category: Option<&'a Label>,
    pub tags: &'a [Label],
}

/// The window of an order whose lines are `lines` under `set` (see the
/// module's rule), `stack_default` when there is no set.
pub fn window_for(set: Option<&ExpiryRuleSet>, lines: &[LineFacts<'_>], stack_default: Duration) -> Duration {
    let Some(set) = set else { return stack_default };
    let matches = |rule: &ExpiryRule, line: &LineFacts<'_>| match &rule.applies_to {
        RuleTarget::Sku(s) => s == line.sku,
        RuleTarget::Category(c) => line.category == Some(c),
        RuleTarget::Tag(t) => line.tags.contains(t),
    };
    let shortest = set
        .rules
        .iter()
        .filter(|rule| lines.iter().any(|line| matches(rule, line)))
        .map(|rule| rule.window_seconds)
        .min();
    match shortest.or(set.default_seconds) {
        Some(s) => Duration::from_secs(s),
        None => stack_default,
    }
}

/// Why a rule set cannot be published: the message names the rule.
pub fn check_rules(default_seconds: Option<u64>, rules: &[ExpiryRule]) -> Result<(), String> {
    let in_range = |s: u64| (MIN_WINDOW_SECONDS..=MAX_WINDOW_SECONDS).contains(&s);
    if let Some(d) = default_seconds.filter(|d| !in_range(*d)) {
        return Err(format!(
            "default_seconds {d} is out of range: a window is {MIN_WINDOW_SECONDS} to {MAX_WINDOW_SECONDS} seconds"
        ));
    }
    if rules.len() > MAX_RULES {
        return Err(format!("rules holds {} rules, more than {MAX_RULES}", rules.len()));
    }
    for (i, rule) in rules.iter().enumerate() {
        if !in_range(rule.window_seconds) {
            return Err(format!(
                "rules[{i}].window_seconds {} is out of range: {MIN_WINDOW_SECONDS} to {MAX_WINDOW_SECONDS} seconds",
                rule.window_seconds
            ));
        }
        if rules[..i].iter().any(|r| r.applies_to == rule.applies_to) {
            return Err(format!("rules[{i}] repeats the target of an earlier rule; give each target one window"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(default_seconds: Option<u64>, rules: Vec<(RuleTarget, u64)>) -> ExpiryRuleSet {
        ExpiryRuleSet {
            version: 3,
            default_seconds,
            rules: rules
                .into_iter()
                .map(|(applies_to, window_seconds)| ExpiryRule { applies_to, window_seconds })
                .collect(),
            published_at: Timestamp::from_unix_millis(0),
            published_by: "ops".into(),
        }
    }
    fn sku(s: &str) -> Sku {
        Sku::parse(s).unwrap()
    }
    fn label(s: &str) -> Label {
        Label::parse(s).unwrap()
    }
    const STACK: Duration = Duration::from_secs(1800);

    #[test]
    fn the_shortest_matching_rule_over_all_lines_gives_the_window() {
        let s = set(
            Some(900),
            vec![
                (RuleTarget::Sku(sku("TICKET")), 300),
                (RuleTarget::Category(label("fresh")), 600),
                (RuleTarget::Tag(label("flash-sale")), 120),
            ],
        );
        let (fresh, flash) = (label("fresh"), [label("flash-sale")]);
        let (ticket, milk, mug, other) = (sku("TICKET"), sku("MILK"), sku("MUG"), sku("OTHER"));
        let ticket_line = LineFacts { sku: &ticket, category: None, tags: &[] };
        let milk_line = LineFacts { sku: &milk, category: Some(&fresh), tags: &[] };
        let mug_line = LineFacts { sku: &mug, category: None, tags: &flash };
        let other_line = LineFacts { sku: &other, category: None, tags: &[] };
        assert_eq!(window_for(Some(&s), std::slice::from_ref(&milk_line), STACK), Duration::from_secs(600));
        assert_eq!(window_for(Some(&s), &[milk_line.clone(), ticket_line.clone()], STACK), Duration::from_secs(300));
        assert_eq!(window_for(Some(&s), &[milk_line, ticket_line, mug_line], STACK), Duration::from_secs(120));
        // No match: the set's default, or the stack's when it has none.
        assert_eq!(window_for(Some(&s), std::slice::from_ref(&other_line), STACK), Duration::from_secs(900));
        let no_default = set(None, vec![(RuleTarget::Sku(sku("TICKET")), 300)]);
        assert_eq!(window_for(Some(&no_default), std::slice::from_ref(&other_line), STACK), STACK);
        assert_eq!(window_for(None, &[other_line], STACK), STACK);
    }

    #[test]
    fn a_rule_set_with_a_window_out_of_range_or_a_repeated_target_is_refused() {
        let rule = |t: RuleTarget, s: u64| ExpiryRule { applies_to: t, window_seconds: s };
        assert!(check_rules(Some(60), &[rule(RuleTarget::Sku(sku("A")), 120)]).is_ok());
        assert!(check_rules(Some(4), &[]).unwrap_err().contains("default_seconds 4"));
        assert!(check_rules(None, &[rule(RuleTarget::Sku(sku("A")), MAX_WINDOW_SECONDS + 1)])
            .unwrap_err()
            .contains("rules[0].window_seconds"));
        let twice = [rule(RuleTarget::Tag(label("x")), 60), rule(RuleTarget::Tag(label("x")), 90)];
        assert!(check_rules(None, &twice).unwrap_err().contains("rules[1] repeats"));
        assert!(Label::parse("has space").is_err());
        assert_eq!(version_name(7), "rules-v7");
    }
}
