//! One error type for the CLI: what went wrong, and what to do about it.

use std::fmt;

#[derive(Debug)]
pub struct CliError {
    pub what: String,
    /// What the operator can do next; empty when there is nothing useful to say.
    pub todo: String,
}

pub type Result<T> = std::result::Result<T, CliError>;

impl CliError {
    pub fn new(what: impl Into<String>, todo: impl Into<String>) -> Self {
        Self { what: what.into(), todo: todo.into() }
    }

    /// A call to AWS (or the emulator) that failed, with its cause chain.
    pub fn aws(doing: &str, e: impl std::error::Error) -> Self {
        Self::new(
            format!("{doing}: {}", chain(&e)),
            "check the credentials (the usual AWS chain), AWS_REGION and, for the local stack, that it is up \
             (`infra/local.sh status`)",
        )
    }
}

/// An error and its sources, joined: the SDK's top-level message alone is
/// often just "service error".
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        source = cause.source();
    }
    s
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.what)?;
        if !self.todo.is_empty() {
            write!(f, "\n  what to do: {}", self.todo)?;
        }
        Ok(())
    }
}

impl From<order_core::ports::Unavailable> for CliError {
    fn from(e: order_core::ports::Unavailable) -> Self {
        Self::aws("reading the orders table", e)
    }
}
