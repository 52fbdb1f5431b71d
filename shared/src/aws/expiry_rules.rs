//! The DynamoDB adapter of [`ExpiryRuleStore`]: each published version of
//! the expiry rules is an item of its own (`EXPIRY_RULES` / `V#<version>`,
//! never changed), and `EXPIRY_RULES` / `CURRENT` holds a copy of the
//! version in force, so a create reads the rules with one `GetItem`.

use super::dynamo::{key, n, s, DynamoStore, Item};
use crate::domain::expiry_rules::ExpiryRuleSet;
use crate::ports::Unavailable;
use crate::store::{Cas, ExpiryRuleStore};
use async_trait::async_trait;
use aws_sdk_dynamodb::types::{Put, TransactWriteItem};

pub const RULES_PK: &str = "EXPIRY_RULES";
pub const CURRENT_SK: &str = "CURRENT";

fn version_sk(version: u64) -> String {
    format!("V#{version:012}")
}

fn rules_item(sk: &str, set: &ExpiryRuleSet) -> Item {
    let mut item = key(RULES_PK.to_owned(), sk);
    item.insert("entity".into(), s("EXPIRY_RULES"));
    item.insert("version".into(), n(set.version));
    item.insert("body".into(), s(serde_json::to_string(set).expect("serialisable")));
    item
}

fn decode(item: Item) -> Result<ExpiryRuleSet, Unavailable> {
    let body =
        item.get("body").and_then(|b| b.as_s().ok()).ok_or_else(|| Unavailable::new("expiry rules", "no body"))?;
    serde_json::from_str(body).map_err(|e| Unavailable::new("decode expiry rules", e))
}

impl DynamoStore {
    pub(crate) async fn read_expiry_rules(&self, sk: &str) -> Result<Option<ExpiryRuleSet>, Unavailable> {
        let out = self
            .client()
            .get_item()
            .table_name(self.table())
            .set_key(Some(key(RULES_PK.to_owned(), sk)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| Unavailable::new("read expiry rules", e))?;
        out.item.map(decode).transpose()
    }
}

#[async_trait]
impl ExpiryRuleStore for DynamoStore {
    async fn publish_expiry_rules(&self, set: &ExpiryRuleSet) -> Result<Cas, Unavailable> {
        let version = Put::builder()
            .table_name(self.table())
            .set_item(Some(rules_item(&version_sk(set.version), set)))
            .condition_expression("attribute_not_exists(pk)")
            .build()
            .expect("complete put");
        let mut current = Put::builder().table_name(self.table()).set_item(Some(rules_item(CURRENT_SK, set)));
        current = if set.version <= 1 {
            current.condition_expression("attribute_not_exists(pk)")
        } else {
            current.condition_expression("version = :before").expression_attribute_values(":before", n(set.version - 1))
        };
        let items = vec![
            TransactWriteItem::builder().put(version).build(),
            TransactWriteItem::builder().put(current.build().expect("complete put")).build(),
        ];
        Ok(match self.transact_items(items, "publish expiry rules").await? {
            Ok(()) => Cas::Applied,
            Err(_) => Cas::Rejected,
        })
    }

    async fn expiry_rules_version(&self, version: u64) -> Result<Option<ExpiryRuleSet>, Unavailable> {
        self.read_expiry_rules(&version_sk(version)).await
    }
}
