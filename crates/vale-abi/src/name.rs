//! Switch and port names: `valeX` and `valeX:Y`, where `X` and `Y` are letters, digits, `_`
//! or `-` (the naming of the VALE papers).

/// Longest switch or port part.
pub const MAX_PART: usize = 32;
/// Longest full port name (it must fit the region header's 64-byte, NUL-terminated field).
pub const MAX_PORT_NAME: usize = 63;

/// Why a name is refused: the words name the whole name, the part at fault and the rule.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// A part (`what`: the switch suffix, the port) is empty.
    #[error("bad name '{name}': empty {what}")]
    Empty { name: String, what: &'static str },
    /// A part is longer than [`MAX_PART`].
    #[error("bad name '{name}': {what} longer than {MAX_PART} characters")]
    PartTooLong { name: String, what: &'static str },
    /// A part holds a character other than a letter, a digit, `_` or `-`.
    #[error("bad name '{name}': {what} may hold letters, digits, '_' and '-', not {c:?}")]
    BadChar {
        name: String,
        what: &'static str,
        c: char,
    },
    /// Not `valeX`.
    #[error("bad name '{name}': a switch is named valeX")]
    NotSwitch { name: String },
    /// Not `valeX:Y`.
    #[error("bad name '{name}': a port is named valeX:Y")]
    NotPort { name: String },
    /// A port name longer than [`MAX_PORT_NAME`].
    #[error("bad name '{name}': longer than {MAX_PORT_NAME} characters")]
    TooLong { name: String },
}

fn check_part(what: &'static str, part: &str, full: &str) -> Result<(), NameError> {
    let name = || full.to_string();
    if part.is_empty() {
        return Err(NameError::Empty { name: name(), what });
    }
    if part.len() > MAX_PART {
        return Err(NameError::PartTooLong { name: name(), what });
    }
    if let Some(c) = part
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
    {
        return Err(NameError::BadChar {
            name: name(),
            what,
            c,
        });
    }
    Ok(())
}

/// Validates a switch name `valeX` and returns it.
pub fn parse_switch(name: &str) -> Result<&str, NameError> {
    let Some(x) = name.strip_prefix("vale") else {
        return Err(NameError::NotSwitch { name: name.into() });
    };
    check_part("switch suffix", x, name)?;
    Ok(name)
}

/// Splits `valeX:Y` into (`valeX`, `Y`), validating both parts.
pub fn parse_port(name: &str) -> Result<(&str, &str), NameError> {
    let not_port = || NameError::NotPort { name: name.into() };
    let Some((sw, port)) = name.split_once(':') else {
        return Err(not_port());
    };
    parse_switch(sw).map_err(|_| not_port())?;
    check_part("port", port, name)?;
    if name.len() > MAX_PORT_NAME {
        return Err(NameError::TooLong { name: name.into() });
    }
    Ok((sw, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(parse_port("vale0:a").unwrap(), ("vale0", "a"));
        assert_eq!(parse_port("vale_x-1:p-2_Z").unwrap(), ("vale_x-1", "p-2_Z"));
        for bad in [
            "vale0",
            "vale:a",
            "vale0:",
            "foo0:a",
            "vale0:a:b",
            "vale0:a b",
            "vale0:é",
        ] {
            assert!(parse_port(bad).is_err(), "{bad}");
        }
        assert!(parse_switch("vale0").is_ok());
        assert!(parse_switch("vale").is_err());
        assert!(parse_port(&format!("vale0:{}", "x".repeat(33))).is_err());
    }

    #[test]
    fn messages_name_the_name_and_the_rule() {
        let words = |r: Result<(&str, &str), NameError>| r.unwrap_err().to_string();
        assert_eq!(
            words(parse_port("vale0")),
            "bad name 'vale0': a port is named valeX:Y"
        );
        assert_eq!(words(parse_port("vale0:")), "bad name 'vale0:': empty port");
        assert_eq!(
            words(parse_port("vale0:a b")),
            "bad name 'vale0:a b': port may hold letters, digits, '_' and '-', not ' '"
        );
        let long = format!("vale0:{}", "x".repeat(33));
        assert_eq!(
            words(parse_port(&long)),
            format!("bad name '{long}': port longer than 32 characters")
        );
        let long = format!("vale{}:{}", "x".repeat(32), "y".repeat(32));
        assert_eq!(
            words(parse_port(&long)),
            format!("bad name '{long}': longer than 63 characters")
        );
        assert_eq!(
            parse_switch("vale").unwrap_err().to_string(),
            "bad name 'vale': empty switch suffix"
        );
        assert_eq!(
            parse_switch("foo").unwrap_err().to_string(),
            "bad name 'foo': a switch is named valeX"
        );
    }
}
