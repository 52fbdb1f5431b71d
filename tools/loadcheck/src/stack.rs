//! The deployed stack loadcheck drives: its outputs (`.local/stack.env`,
//! the process environment taking precedence) and an SDK configuration
//! that talks to it (the emulator when `AWS_ENDPOINT_URL` is set, AWS with
//! the usual credential chain otherwise).

use std::collections::HashMap;
use std::path::Path;

pub struct Stack {
    outputs: HashMap<String, String>,
    pub sdk: aws_config::SdkConfig,
}

impl Stack {
    /// Reads `env_file` (KEY=VALUE lines; missing file = no outputs) and
    /// builds the SDK configuration.
    pub async fn load(env_file: &Path) -> Result<Self, String> {
        let mut outputs: HashMap<String, String> = match std::fs::read_to_string(env_file) {
            Ok(text) => text
                .lines()
                .filter(|l| !l.trim_start().starts_with('#'))
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.trim().to_owned(), v.trim().trim_matches('"').to_owned()))
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => HashMap::new(),
            Err(e) => return Err(format!("reading {}: {e}", env_file.display())),
        };
        for (k, v) in std::env::vars() {
            outputs.insert(k, v);
        }
        let region = outputs.get("AWS_REGION").cloned().unwrap_or_else(|| "us-east-1".to_owned());
        let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .http_client(order_core::aws::http_client())
            .region(aws_config::Region::new(region));
        if let Some(endpoint) = outputs.get("AWS_ENDPOINT_URL") {
            // The emulator: any credentials do; the file's dummy ones if the
            // environment has none.
            let id = outputs.get("AWS_ACCESS_KEY_ID").cloned().unwrap_or_else(|| "test".into());
            let secret = outputs.get("AWS_SECRET_ACCESS_KEY").cloned().unwrap_or_else(|| "test".into());
            loader = loader.endpoint_url(endpoint).credentials_provider(aws_credential_types::Credentials::new(
                id, secret, None, None, "loadcheck",
            ));
        }
        Ok(Self { outputs, sdk: loader.load().await })
    }

    /// A stack output (or environment variable), naming it when missing.
    pub fn get(&self, name: &str) -> Result<&str, String> {
        self.outputs
            .get(name)
            .map(String::as_str)
            .ok_or_else(|| format!("{name} is not set: run `infra/local.sh up` first, or export the stack's outputs"))
    }

    pub fn get_opt(&self, name: &str) -> Option<&str> {
        self.outputs.get(name).map(String::as_str)
    }
}
