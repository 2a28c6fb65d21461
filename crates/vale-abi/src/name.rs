//! Switch and port names: `valeX` and `valeX:Y`, where `X` and `Y` are letters, digits, `_`
//! or `-` (the naming of the VALE papers).

/// Longest switch or port part.
pub const MAX_PART: usize = 32;
/// Longest full port name (it must fit the region header's 64-byte, NUL-terminated field).
pub const MAX_PORT_NAME: usize = 63;

fn check_part(what: &str, part: &str, full: &str) -> Result<(), String> {
    if part.is_empty() {
        return Err(format!("bad name '{full}': empty {what}"));
    }
    if part.len() > MAX_PART {
        return Err(format!(
            "bad name '{full}': {what} longer than {MAX_PART} characters"
        ));
    }
    if let Some(c) = part
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
    {
        return Err(format!(
            "bad name '{full}': {what} may hold letters, digits, '_' and '-', not {c:?}"
        ));
    }
    Ok(())
}

/// Validates a switch name `valeX` and returns it.
pub fn parse_switch(name: &str) -> Result<&str, String> {
    let Some(x) = name.strip_prefix("vale") else {
        return Err(format!("bad name '{name}': a switch is named valeX"));
    };
    check_part("switch suffix", x, name)?;
    Ok(name)
}

/// Splits `valeX:Y` into (`valeX`, `Y`), validating both parts.
pub fn parse_port(name: &str) -> Result<(&str, &str), String> {
    let Some((sw, port)) = name.split_once(':') else {
        return Err(format!("bad name '{name}': a port is named valeX:Y"));
    };
    parse_switch(sw).map_err(|_| format!("bad name '{name}': a port is named valeX:Y"))?;
    check_part("port", port, name)?;
    if name.len() > MAX_PORT_NAME {
        return Err(format!(
            "bad name '{name}': longer than {MAX_PORT_NAME} characters"
        ));
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
}
