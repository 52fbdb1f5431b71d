//! Which stack `orderctl` talks to, and how: its outputs (table, queues,
//! functions, API URL) and the AWS configuration to reach it.
//!
//! Precedence: `--stack NAME` reads that stack's CloudFormation outputs
//! (DescribeStacks, through the usual credential chain and
//! `AWS_ENDPOINT_URL`); without it, the `.local/stack.env` that
//! `infra/local.sh up` writes (`--env-file`, else the nearest one in the
//! current folder or a parent) is used, its connection settings filling in
//! whatever the process environment does not set.

use crate::error::{CliError, Result};
use crate::signed::Signed;
use aws_config::SdkConfig;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The stack's outputs under their `.local/stack.env` names (UPPER_SNAKE),
/// and the SDK configuration that reaches it.
pub struct Stack {
    /// Where the outputs came from, for messages.
    pub source: String,
    values: BTreeMap<String, String>,
    pub sdk: SdkConfig,
}

impl Stack {
    pub fn opt(&self, key: &str) -> Option<&str> {
        self.values.get(key).map(String::as_str).filter(|v| !v.is_empty())
    }

    /// A required output, with an error that names it and where it was looked for.
    pub fn get(&self, key: &str) -> Result<&str> {
        self.opt(key).ok_or_else(|| {
            CliError::new(
                format!("{key} is not among the outputs of {}", self.source),
                "deploy the current template.yaml (older stacks lack some outputs), or point --stack / --env-file \
                 at the right stack",
            )
        })
    }

    /// Every `<FUNCTION>_FUNCTION_NAME` output: short name → function name.
    pub fn functions(&self) -> Vec<(String, String)> {
        self.values
            .iter()
            .filter_map(|(k, v)| {
                let short = k.strip_suffix("_FUNCTION_NAME")?;
                Some((short.to_lowercase().replace('_', "-"), v.clone()))
            })
            .collect()
    }

    /// The API base URL: the stack's effective one (`ApiBaseUrlOverride`
    /// when set: an emulator's or a custom domain's), else the AWS form.
    pub fn api_base_url(&self) -> Result<&str> {
        self.opt("EFFECTIVE_API_BASE_URL")
            .or_else(|| self.opt("API_BASE_URL"))
            .map(|u| u.trim_end_matches('/'))
            .ok_or_else(|| CliError::new(format!("no API URL among the outputs of {}", self.source), "redeploy"))
    }

    pub fn table(&self) -> Result<&str> {
        self.opt("ORDERS_TABLE_NAME").or_else(|| self.opt("TABLE_NAME")).ok_or_else(|| {
            CliError::new(format!("no ORDERS_TABLE_NAME among the outputs of {}", self.source), "redeploy")
        })
    }
}

/// Picks the stack as the module docs say.
pub async fn resolve(stack: Option<&str>, env_file: Option<&Path>) -> Result<Stack> {
    if let Some(name) = stack {
        let sdk = sdk_config(&BTreeMap::new()).await;
        let outputs = describe_stack_outputs(&sdk, name).await?;
        let mut values: BTreeMap<String, String> = outputs.into_iter().map(|(k, v)| (snake(&k), v)).collect();
        values.insert("STACK_NAME".into(), name.to_owned());
        return Ok(Stack { source: format!("stack {name} (CloudFormation outputs)"), values, sdk });
    }
    let path = match env_file {
        Some(p) => p.to_path_buf(),
        None => find_env_file().ok_or_else(|| {
            CliError::new(
                "no stack chosen",
                "pass --stack NAME (reads its CloudFormation outputs), or run inside the repo after \
                 `infra/local.sh up` (which writes .local/stack.env), or pass --env-file PATH",
            )
        })?,
    };
    let text = std::fs::read_to_string(&path)
        .map_err(|e| CliError::new(format!("cannot read {}: {e}", path.display()), "check --env-file"))?;
    let values = parse_env_file(&text);
    let sdk = sdk_config(&values).await;
    Ok(Stack { source: path.display().to_string(), values, sdk })
}

fn find_env_file() -> Option<PathBuf> {
    let cwd = std::env::current_dir().ok()?;
    cwd.ancestors().map(|d| d.join(".local/stack.env")).find(|p| p.is_file())
}

/// `KEY=VALUE` lines; blank lines, comments and `export ` prefixes allowed.
pub fn parse_env_file(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.strip_prefix("export ").unwrap_or(l).split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().trim_matches('"').trim_matches('\'').to_owned()))
        .collect()
}

/// The SDK configuration: the usual chain, with the env file's endpoint,
/// region and (dummy) keys where the process environment has none.
async fn sdk_config(file: &BTreeMap<String, String>) -> SdkConfig {
    let unset = |k: &str| std::env::var(k).map(|v| v.is_empty()).unwrap_or(true);
    let mut loader =
        aws_config::defaults(aws_config::BehaviorVersion::latest()).http_client(order_core::aws::http_client());
    if let (true, Some(url)) = (unset("AWS_ENDPOINT_URL"), file.get("AWS_ENDPOINT_URL")) {
        loader = loader.endpoint_url(url);
    }
    if let (true, true, Some(region)) = (unset("AWS_REGION"), unset("AWS_DEFAULT_REGION"), file.get("AWS_REGION")) {
        loader = loader.region(aws_config::Region::new(region.clone()));
    }
    if let (true, Some(id), Some(secret)) =
        (unset("AWS_ACCESS_KEY_ID"), file.get("AWS_ACCESS_KEY_ID"), file.get("AWS_SECRET_ACCESS_KEY"))
    {
        loader =
            loader.credentials_provider(aws_credential_types::Credentials::new(id, secret, None, None, "stack.env"));
    }
    loader.load().await
}

/// `CloseDlqUrl` → `CLOSE_DLQ_URL`: the names `infra/deploy.py` writes to
/// `.local/stack.env`, so both sources answer to the same keys.
pub fn snake(name: &str) -> String {
    let chars: Vec<char> = name.chars().collect();
    let mut out = String::with_capacity(name.len() + 8);
    for (i, &c) in chars.iter().enumerate() {
        if i > 0 && c.is_ascii_uppercase() {
            let prev = chars[i - 1];
            let next_lower = chars.get(i + 1).is_some_and(|n| n.is_ascii_lowercase());
            if prev.is_ascii_lowercase() || prev.is_ascii_digit() || (prev.is_ascii_uppercase() && next_lower) {
                out.push('_');
            }
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

/// DescribeStacks (query protocol; XML answer): the stack's outputs.
async fn describe_stack_outputs(sdk: &SdkConfig, name: &str) -> Result<Vec<(String, String)>> {
    let signed = Signed::new(sdk)?;
    let body = format!("Action=DescribeStacks&Version=2010-05-15&StackName={}", crate::signed::form_encode(name));
    let url = format!("{}/", signed.endpoint("cloudformation"));
    let headers = [("content-type", "application/x-www-form-urlencoded; charset=utf-8")];
    let (status, text) = signed.send("cloudformation", "POST", &url, &headers, body.into_bytes()).await?;
    if !(200..300).contains(&status) {
        let message = xml_text(&text, "Message").unwrap_or(text.clone());
        return Err(CliError::new(
            format!("DescribeStacks {name}: {message} (HTTP {status})"),
            "check the stack name (`aws cloudformation list-stacks`), the region (AWS_REGION) and your credentials",
        ));
    }
    parse_outputs(&text)
}

/// The `Outputs` of a DescribeStacksResponse as (OutputKey, OutputValue).
pub fn parse_outputs(xml: &str) -> Result<Vec<(String, String)>> {
    use quick_xml::events::Event;
    let mut reader = quick_xml::Reader::from_str(xml);
    let (mut path, mut out): (Vec<String>, Vec<(String, String)>) = (Vec::new(), Vec::new());
    let (mut key, mut value) = (None::<String>, None::<String>);
    loop {
        match reader.read_event() {
            Ok(Event::Start(e)) => path.push(String::from_utf8_lossy(e.local_name().as_ref()).into_owned()),
            Ok(Event::End(_)) => {
                let closed = path.pop().unwrap_or_default();
                if closed == "member" && path.last().is_some_and(|p| p == "Outputs") {
                    if let (Some(k), v) = (key.take(), value.take()) {
                        out.push((k, v.unwrap_or_default()));
                    }
                }
            }
            Ok(Event::Text(t)) => {
                let text = t.unescape().map(|c| c.into_owned()).unwrap_or_default();
                let inside_outputs = path.iter().any(|p| p == "Outputs");
                match path.last().map(String::as_str) {
                    Some("OutputKey") if inside_outputs => key = Some(text),
                    Some("OutputValue") if inside_outputs => value = Some(value.unwrap_or_default() + &text),
                    _ => {}
                }
            }
            Ok(Event::Eof) => break,
            Ok(_) => {}
            Err(e) => return Err(CliError::new(format!("DescribeStacks answered XML that does not parse: {e}"), "")),
        }
    }
    Ok(out)
}

/// The text of the first `<tag>` in an XML error answer.
fn xml_text(xml: &str, tag: &str) -> Option<String> {
    let start = xml.find(&format!("<{tag}>"))? + tag.len() + 2;
    let end = xml[start..].find(&format!("</{tag}>"))? + start;
    Some(xml[start..end].to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_keys_become_the_env_file_names() {
        assert_eq!(snake("CloseDlqUrl"), "CLOSE_DLQ_URL");
        assert_eq!(snake("OrderPlacedQueueDlqUrl"), "ORDER_PLACED_QUEUE_DLQ_URL");
        assert_eq!(snake("HttpApiId"), "HTTP_API_ID");
        assert_eq!(snake("ApiBaseUrl"), "API_BASE_URL");
        assert_eq!(snake("SQSQueueUrl"), "SQS_QUEUE_URL");
        assert_eq!(snake("DueIndexShardsSweep"), "DUE_INDEX_SHARDS_SWEEP");
    }

    #[test]
    fn describe_stacks_outputs_are_read_from_the_xml() {
        let xml = r#"<DescribeStacksResponse xmlns="http://cloudformation.amazonaws.com/doc/2010-05-15/">
          <DescribeStacksResult><Stacks><member><StackName>s</StackName><Outputs>
            <member><OutputKey>CloseDlqUrl</OutputKey><OutputValue>http://q/1?a=1&amp;b=2</OutputValue></member>
            <member><Description>d</Description><OutputKey>Empty</OutputKey><OutputValue></OutputValue></member>
          </Outputs><Tags><member><Key>k</Key><Value>v</Value></member></Tags></member></Stacks>
          </DescribeStacksResult></DescribeStacksResponse>"#;
        let outputs = parse_outputs(xml).unwrap();
        assert_eq!(outputs, vec![("CloseDlqUrl".into(), "http://q/1?a=1&b=2".into()), ("Empty".into(), "".into())]);
    }

    #[test]
    fn the_env_file_reads_plain_and_exported_lines() {
        let v = parse_env_file("# c\nA=1\nexport B=\"two\"\n\nC = x=y\n");
        assert_eq!(v.get("A").unwrap(), "1");
        assert_eq!(v.get("B").unwrap(), "two");
        assert_eq!(v.get("C").unwrap(), "x=y");
    }
}
