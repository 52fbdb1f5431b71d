//! Publishing the expiry rules (`PUT /admin/expiry-rules`) and reading
//! them back. A publication is a new version, written only if the version
//! in force is still the one the operator read (`if_version`) or, without
//! it, the one this request read; orders already placed keep their window.

use crate::domain::expiry_rules::{check_rules, ExpiryRule, ExpiryRuleSet};
use crate::ports::Clock;
use crate::store::{Cas, ExpiryRuleStore, OrderStore};
use crate::usecases::UseCaseError;
use tracing::info;

/// What an operator publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishRequest {
    /// The version the operator read (0: none published yet); `None`:
    /// publish over whatever is in force.
    pub if_version: Option<u64>,
    pub default_seconds: Option<u64>,
    pub rules: Vec<ExpiryRule>,
    pub by: String,
}

pub async fn publish<S: OrderStore + ExpiryRuleStore>(
    store: &S,
    clock: &dyn Clock,
    req: PublishRequest,
) -> Result<ExpiryRuleSet, UseCaseError> {
    check_rules(req.default_seconds, &req.rules).map_err(UseCaseError::Invalid)?;
    let in_force = store.current_expiry_rules().await?.map_or(0, |s| s.version);
    let changed = || {
        UseCaseError::conflict(
            "rules_changed",
            format!(
                "the rules in force are version {in_force}, not the {} this publication was made from; read them \
                 (GET /admin/expiry-rules) and publish again",
                req.if_version.unwrap_or(in_force)
            ),
        )
    };
    if req.if_version.is_some_and(|v| v != in_force) {
        return Err(changed());
    }
    let set = ExpiryRuleSet {
        version: in_force + 1,
        default_seconds: req.default_seconds,
        rules: req.rules.clone(),
        published_at: clock.now(),
        published_by: req.by.clone(),
    };
    match store.publish_expiry_rules(&set).await? {
        Cas::Applied => {
            info!(version = set.version, rules = set.rules.len(), by = %set.published_by, "expiry rules published");
            Ok(set)
        }
        Cas::Rejected => Err(changed()),
    }
}

/// The rules in force.
pub async fn current<S: OrderStore>(store: &S) -> Result<ExpiryRuleSet, UseCaseError> {
    store.current_expiry_rules().await?.ok_or_else(|| UseCaseError::not_found("published expiry rules"))
}

/// A published version, in force or not.
pub async fn version<S: ExpiryRuleStore>(store: &S, version: u64) -> Result<ExpiryRuleSet, UseCaseError> {
    store
        .expiry_rules_version(version)
        .await?
        .ok_or_else(|| UseCaseError::not_found(format!("expiry rules version {version}")))
}
