//! Switches read from `MOESTREAM_*` environment variables: a value outside the named choices
//! is refused by name instead of being taken for the default.

use crate::error::{Error, Result};

/// The choice `name`'s value names among `choices` (value, meaning), `None` when it is unset.
pub(crate) fn env_choice<T: Copy>(name: &str, choices: &[(&str, T)]) -> Result<Option<T>> {
    let Ok(value) = std::env::var(name) else { return Ok(None) };
    match choices.iter().find(|(v, _)| *v == value) {
        Some(&(_, meaning)) => Ok(Some(meaning)),
        None => {
            let names: Vec<&str> = choices.iter().map(|(v, _)| *v).collect();
            Err(Error::InvalidArgument(format!("{name}={value}: expected {}", names.join(", "))))
        }
    }
}
