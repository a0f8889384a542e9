//! Two small text formats the helper reads: the variable expansion the runner applies to
//! `--path`, `--exclude` and `--name` (`mvdan.cc/sh/v3/shell.Expand(s, nil)` in
//! `cache_archiver.go` / `artifacts_uploader.go` `normalizeArgs`: expansion as inside double
//! quotes, variables from the environment), and the env file of the cache commands
//! (`github.com/joho/godotenv` `Read`, called by `cache_env.go` `loadEnvFile`).
//!
//! Limits: `Expand` handles `$NAME`, `${NAME}`, `${NAME:-word}`, `${NAME-word}`,
//! `${NAME:+word}`, `${NAME+word}` and backslash escapes; any other `${…}` form, `$(…)` or
//! `$((…))` is an error (the runner then warns `invalid path` and keeps the text as given).
//! The env file reader handles `KEY=value`, `KEY: value`, `export KEY=…`, comments, single
//! quotes (raw), double quotes (`\n`, `\r`, `\x` escapes) and `$NAME` / `${NAME}` from keys
//! earlier in the same file, as godotenv does.
//!
//! Owns: both parsers. Must not know: where the values are used.

use std::collections::BTreeMap;

use crate::ctx::Env;

/// `shell.Expand(text, nil)` for the forms listed in the module doc.
pub fn shell_expand(text: &str, env: &Env) -> Result<String, String> {
    let mut out = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(next @ ('$' | '`' | '"' | '\\')) => out.push(next),
                Some('\n') => {}
                Some(next) => {
                    out.push('\\');
                    out.push(next);
                }
                None => out.push('\\'),
            },
            '$' => out.push_str(&dollar(&mut chars, env)?),
            '`' => return Err("command substitution is not supported".into()),
            _ => out.push(c),
        }
    }
    Ok(out)
}

fn dollar(
    chars: &mut std::iter::Peekable<std::str::Chars<'_>>,
    env: &Env,
) -> Result<String, String> {
    match chars.peek().copied() {
        Some('{') => {
            chars.next();
            let mut inner = String::new();
            let mut depth = 1;
            for c in chars.by_ref() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            return braced(&inner, env);
                        }
                    }
                    _ => {}
                }
                inner.push(c);
            }
            Err("reached EOF without matching ${ with }".into())
        }
        Some('(') => Err("command and arithmetic substitution are not supported".into()),
        Some(c) if c == '_' || c.is_ascii_alphabetic() => {
            let mut name = String::new();
            while let Some(&c) = chars.peek() {
                if c == '_' || c.is_ascii_alphanumeric() {
                    name.push(c);
                    chars.next();
                } else {
                    break;
                }
            }
            Ok(env.get(&name).unwrap_or("").to_string())
        }
        _ => Ok("$".into()),
    }
}

fn braced(inner: &str, env: &Env) -> Result<String, String> {
    let name_len = inner
        .find(|c: char| !(c == '_' || c.is_ascii_alphanumeric()))
        .unwrap_or(inner.len());
    let (name, operator) = inner.split_at(name_len);
    if name.is_empty() {
        return Err(format!("unsupported parameter expansion ${{{inner}}}"));
    }
    let value = env.get(name);
    let set_and_not_empty = value.is_some_and(|v| !v.is_empty());
    let word = |w: &str| shell_expand(w, env);
    match operator {
        "" => Ok(value.unwrap_or("").to_string()),
        _ if operator.starts_with(":-") => {
            if set_and_not_empty {
                Ok(value.unwrap_or("").to_string())
            } else {
                word(operator.get(2..).unwrap_or(""))
            }
        }
        _ if operator.starts_with(":+") => {
            if set_and_not_empty {
                word(operator.get(2..).unwrap_or(""))
            } else {
                Ok(String::new())
            }
        }
        _ if operator.starts_with('-') => match value {
            Some(v) => Ok(v.to_string()),
            None => word(operator.get(1..).unwrap_or("")),
        },
        _ if operator.starts_with('+') => match value {
            Some(_) => word(operator.get(1..).unwrap_or("")),
            None => Ok(String::new()),
        },
        _ => Err(format!("unsupported parameter expansion ${{{inner}}}")),
    }
}

/// godotenv `Read` of the env file's text: the pairs, in file order.
pub fn parse_dotenv(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut pairs: Vec<(String, String)> = Vec::new();
    let mut known: BTreeMap<String, String> = BTreeMap::new();
    let mut rest = text;
    while !rest.is_empty() {
        let trimmed = rest.trim_start();
        if trimmed.is_empty() {
            break;
        }
        if trimmed.starts_with('#') {
            rest = trimmed.split_once('\n').map_or("", |(_, after)| after);
            continue;
        }
        let line = trimmed.strip_prefix("export ").unwrap_or(trimmed);
        let separator = line
            .find(['=', ':', '\n'])
            .filter(|at| matches!(line.as_bytes().get(*at), Some(b'=' | b':')))
            .ok_or_else(|| {
                format!(
                    "unexpected character in variable name near {:?}",
                    first_line(line)
                )
            })?;
        let key = line.get(..separator).unwrap_or("").trim().to_string();
        if key.is_empty() || key.contains(char::is_whitespace) {
            return Err(format!("invalid variable name near {:?}", first_line(line)));
        }
        let after = line.get(separator + 1..).unwrap_or("");
        let after = after.trim_start_matches([' ', '\t']);
        let (value, next) = dotenv_value(after, &known)?;
        known.insert(key.clone(), value.clone());
        pairs.push((key, value));
        rest = next;
    }
    Ok(pairs)
}

fn first_line(text: &str) -> &str {
    text.split('\n').next().unwrap_or(text)
}

/// One value and the text after it.
fn dotenv_value<'a>(
    text: &'a str,
    known: &BTreeMap<String, String>,
) -> Result<(String, &'a str), String> {
    if let Some(quoted) = text.strip_prefix('\'') {
        let end = quoted.find('\'').ok_or("unterminated quoted value")?;
        let value = quoted.get(..end).unwrap_or("").to_string();
        return Ok((value, after_line(quoted.get(end + 1..).unwrap_or(""))));
    }
    if let Some(quoted) = text.strip_prefix('"') {
        let mut end = None;
        let mut escaped = false;
        for (at, c) in quoted.char_indices() {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => {
                    end = Some(at);
                    break;
                }
                _ => {}
            }
        }
        let end = end.ok_or("unterminated quoted value")?;
        let raw = quoted.get(..end).unwrap_or("");
        let value = expand_dotenv_vars(&unescape_dotenv(raw), known);
        return Ok((value, after_line(quoted.get(end + 1..).unwrap_or(""))));
    }
    let (line, next) = text.split_once('\n').unwrap_or((text, ""));
    let line = match line.find(" #") {
        Some(at) => line.get(..at).unwrap_or(line),
        None => line,
    };
    Ok((expand_dotenv_vars(line.trim(), known), next))
}

fn after_line(text: &str) -> &str {
    text.split_once('\n').map_or("", |(_, after)| after)
}

/// godotenv `expandEscapes`: `\n` and `\r` become control characters, `\x` becomes `x`
/// (`\$` is kept for the variable step).
fn unescape_dotenv(raw: &str) -> String {
    let mut out = String::new();
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('$') => out.push_str("\\$"),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    out
}

/// godotenv `expandVariables`: `$NAME` / `${NAME}` from earlier keys; `\$` is a literal `$`.
fn expand_dotenv_vars(text: &str, known: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' && chars.peek() == Some(&'$') {
            chars.next();
            out.push('$');
            continue;
        }
        if c != '$' {
            out.push(c);
            continue;
        }
        let braced = chars.peek() == Some(&'{');
        if braced {
            chars.next();
        }
        let mut name = String::new();
        while let Some(&n) = chars.peek() {
            if n == '_' || n.is_ascii_alphanumeric() {
                name.push(n);
                chars.next();
            } else {
                break;
            }
        }
        if braced && chars.peek() == Some(&'}') {
            chars.next();
        }
        if name.is_empty() && !braced {
            out.push('$');
        } else {
            out.push_str(known.get(&name).map_or("", String::as_str));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variables_in_paths_expand_from_the_environment() {
        let env = Env::from_pairs(&[("DIR", "out"), ("EMPTY", "")]);
        let cases = [
            ("$DIR/a", "out/a"),
            ("${DIR}/b*", "out/b*"),
            ("${EMPTY:-dflt}/c", "dflt/c"),
            ("${UNSET-x}", "x"),
            ("\\$DIR", "$DIR"),
            ("**/*.txt", "**/*.txt"),
        ];
        for (given, expected) in cases {
            assert_eq!(shell_expand(given, &env).expect(given), expected, "{given}");
        }
        assert!(shell_expand("$(id)", &env).is_err());
    }

    #[test]
    fn the_runners_env_file_reads_back_with_quotes_and_escapes() {
        let text = "AZURE_STORAGE_ACCOUNT=\"acct\"\nCACHE_METADATA=\"{\\\"cachekey\\\":\\\"k\\\"}\"\n\
                    # comment\nexport PLAIN=value # trailing\nSINGLE='a\\nb'\nREF=\"${PLAIN}-2\"\n";
        let pairs = parse_dotenv(text).expect("valid env file");
        let get = |k: &str| {
            pairs
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(get("AZURE_STORAGE_ACCOUNT").as_deref(), Some("acct"));
        assert_eq!(
            get("CACHE_METADATA").as_deref(),
            Some("{\"cachekey\":\"k\"}")
        );
        assert_eq!(get("PLAIN").as_deref(), Some("value"));
        assert_eq!(get("SINGLE").as_deref(), Some("a\\nb"));
        assert_eq!(get("REF").as_deref(), Some("value-2"));
    }

    #[test]
    fn a_sas_token_with_ampersands_survives_the_env_file() {
        let pairs = parse_dotenv("AZURE_STORAGE_SAS_TOKEN=\"sv=2022&sig=a%2Bb\"\n").expect("valid");
        assert_eq!(
            pairs,
            vec![(
                "AZURE_STORAGE_SAS_TOKEN".to_string(),
                "sv=2022&sig=a%2Bb".to_string()
            )]
        );
    }
}
