//! The bash writer: what `shells/bash.go` `BashWriter` prints for each primitive, its quoting
//! (`helpers/shell_escape.go` `ShellEscape`, Go's `%q`, plain double quotes for the
//! `CommandArgExpand` family) and the wrapper `Finish` puts around a stage.
//!
//! Owns: text layout and quoting. Must not know: stages or git.

const BOLD_GREEN: &str = "\u{1b}[32;1m";
const YELLOW: &str = "\u{1b}[0;33m";
const RESET: &str = "\u{1b}[0;m";

/// A stage script being written; indentation follows `if`/`else` as the runner's does.
pub struct Shell {
    body: String,
    indent: usize,
    /// `BashWriter.TemporaryPath`: `<project dir>.tmp`.
    pub tmp: String,
}

impl Shell {
    pub fn new(tmp: &str) -> Shell {
        Shell {
            body: String::new(),
            indent: 0,
            tmp: tmp.into(),
        }
    }

    /// `Line`: one indented line.
    pub fn line(&mut self, text: &str) {
        self.body.push_str(&"  ".repeat(self.indent));
        self.body.push_str(text);
        self.body.push('\n');
    }

    /// `Command`: every word `ShellEscape`d.
    pub fn command(&mut self, command: &str, args: &[&str]) {
        let line = build(escape, command, args);
        self.line(&line);
    }

    /// `CommandArgExpand`: arguments in plain double quotes, so `$VAR` expands at run time.
    pub fn command_expand(&mut self, command: &str, args: &[&str]) {
        let line = build(double_quote, command, args);
        self.line(&line);
    }

    /// `CommandWithStdin` with `bestEffort`: `echo <stdin> | <command> || true`.
    pub fn command_with_stdin_best_effort(&mut self, stdin: &str, command: &str, args: &[&str]) {
        let producer = build(escape, "echo", &[stdin]);
        let consumer = build(escape, command, args);
        self.line(&format!("{producer} | {consumer} || true"));
    }

    /// `IfCmd`: the command's output discarded.
    pub fn if_cmd(&mut self, command: &str, args: &[&str]) {
        let line = build(escape, command, args);
        self.open_if(&format!("{line} >/dev/null 2>&1"));
    }

    /// `IfCmdWithOutput`.
    pub fn if_cmd_with_output(&mut self, command: &str, args: &[&str]) {
        let line = build(escape, command, args);
        self.open_if(&line);
    }

    /// `IfCmdWithOutputArgExpand`.
    pub fn if_cmd_with_output_expand(&mut self, command: &str, args: &[&str]) {
        let line = build(double_quote, command, args);
        self.open_if(&line);
    }

    fn open_if(&mut self, condition: &str) {
        self.line(&format!("if {condition} ; then"));
        self.indent += 1;
    }

    /// `IfDirectory`.
    pub fn if_directory(&mut self, path: &str) {
        self.line(&format!("if [ -d {} ]; then", go_quote(path)));
        self.indent += 1;
    }

    /// `IfFile`.
    pub fn if_file(&mut self, path: &str) {
        self.line(&format!("if [ -e {} ]; then", go_quote(path)));
        self.indent += 1;
    }

    pub fn else_(&mut self) {
        self.indent = self.indent.saturating_sub(1);
        self.line("else");
        self.indent += 1;
    }

    pub fn end_if(&mut self) {
        self.indent = self.indent.saturating_sub(1);
        self.line("fi");
    }

    pub fn cd(&mut self, path: &str) {
        self.command("cd", &[path]);
    }

    pub fn mkdir(&mut self, path: &str) {
        self.command("mkdir", &["-p", path]);
    }

    /// `MkTmpDir`: makes `<tmp>/<name>` and returns it (joined, not made absolute).
    pub fn mk_tmp_dir(&mut self, name: &str) -> String {
        let path = join(&[&self.tmp, name]);
        self.mkdir(&path);
        path
    }

    /// `RmDir`: made writable first, then removed.
    pub fn rm_dir(&mut self, path: &str) {
        self.if_directory(path);
        self.command_expand("chmod", &["-R", "u+rwX", path]);
        self.end_if();
        self.command_expand("rm", &["-r", "-f", path]);
    }

    pub fn rm_file(&mut self, path: &str) {
        self.command_expand("rm", &["-f", path]);
    }

    /// `RmFilesRecursive` / `RmDirsRecursive`: portable `find -exec` removal.
    pub fn rm_recursive(&mut self, path: &str, name: &str, dirs: bool) {
        self.if_directory(path);
        let action = if dirs {
            "-type d -depth -exec rm -rf -- {}"
        } else {
            "-type f -exec rm -f {}"
        };
        self.line(&format!(
            r#"et='+' ; find /dev/null -exec true {{}} + 2>/dev/null || et=';' ; find {} -name {} {action} "${{et}}""#,
            go_quote(path),
            go_quote(name)
        ));
        self.end_if();
    }

    /// `TmpFile`: a file in the temporary dir (absolute, as `cleanPath` makes it).
    pub fn tmp_file(&self, name: &str) -> String {
        let path = join(&[&self.tmp, name]);
        if path.starts_with('/') {
            path
        } else {
            join(&["$PWD", &path])
        }
    }

    /// `Noticef`: bold green.
    pub fn notice(&mut self, text: &str) {
        let colored = format!("{BOLD_GREEN}{text}{RESET}");
        self.line(&format!("echo {}", escape(&colored)));
    }

    /// `Warningf`: yellow.
    pub fn warning(&mut self, text: &str) {
        let colored = format!("{YELLOW}{text}{RESET}");
        self.line(&format!("echo {}", escape(&colored)));
    }

    pub fn empty_line(&mut self) {
        self.line("echo");
    }

    /// `Variable` for a plain variable: `export KEY=<escaped value>`.
    pub fn export(&mut self, key: &str, value: &str) {
        self.line(&format!("export {}={}", escape(key), escape(value)));
    }

    /// `Variable` for a file variable: the value written to `<tmp>/<KEY>`, the path exported.
    pub fn export_file(&mut self, key: &str, value: &str) {
        let file = self.tmp_file(key);
        self.line(&format!("mkdir -p {}", go_quote(&self.tmp)));
        self.line(&format!(
            "printf '%s' {} > {}",
            escape(value),
            go_quote(&file)
        ));
        self.line(&format!("export {}={}", escape(key), go_quote(&file)));
    }

    /// `ExportRaw`: the value in double quotes, expanded at run time.
    pub fn export_raw(&mut self, key: &str, value: &str) {
        self.line(&format!("export {}={}", escape(key), double_quote(value)));
    }

    /// `SourceEnv`: loads the job's `GITLAB_ENV` file, line by line.
    pub fn source_env(&mut self, path: &str) {
        self.line(&format!("mkdir -p {}", go_quote(&self.tmp)));
        self.line(&format!("touch {}", go_quote(path)));
        self.line(&format!(
            r#"while read -r line; do export "$line"; done < {}"#,
            go_quote(path)
        ));
    }

    /// `DotEnvVariables`: an unquoted heredoc writing `KEY="value"` lines, keys sorted
    /// (`helpers.DotEnvEscape`); returns the file's path.
    pub fn dot_env(&mut self, name: &str, variables: &[(String, String)]) -> String {
        let file = self.tmp_file(name);
        let mut sorted: Vec<&(String, String)> = variables.iter().collect();
        sorted.sort();
        let mut text = format!("cat << EOF > {file}\n");
        for (key, value) in sorted {
            let valid = key
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if valid {
                let value = value
                    .replace('\\', "\\\\")
                    .replace('"', "\\\"")
                    .replace('\n', "\\n")
                    .replace('\r', "\\r");
                text.push_str(&format!("{key}=\"{value}\"\n"));
            }
        }
        text.push_str("EOF\n");
        self.line(&text);
        file
    }

    /// `Finish`: the shebang, the TERM trap, errexit/pipefail, and the body `eval`ed in a
    /// subshell with stdin closed (bash.go `Finish`, default `FF_USE_LEGACY_BASH_EVAL` off).
    pub fn finish(self, trace: bool) -> String {
        let trap = "trap 'exit 1' TERM";
        let mut out = format!("#!/usr/bin/env bash\n\n{trap}\n\n");
        if trace {
            out.push_str("set -o xtrace\n");
        }
        out.push_str(
            "case \"$(set -o)\" in *\"pipefail\"*) set -o pipefail;; esac; set -o errexit\n",
        );
        out.push_str("set +o noclobber\n");
        out.push_str(&format!(
            "({trap}; eval {}) < /dev/null\n",
            escape(&self.body)
        ));
        out.push_str("exit 0\n");
        out
    }
}

fn build(quote: fn(&str) -> String, command: &str, args: &[&str]) -> String {
    let mut words = vec![escape(command)];
    words.extend(args.iter().map(|a| quote(a)));
    words.join(" ")
}

pub fn double_quote(text: &str) -> String {
    format!("\"{text}\"")
}

/// `helpers.ShellEscape`: as is when only safe characters; else ANSI-C `$'…'` quoting with
/// C escapes for control characters and `\xHH` for every other unsafe byte.
pub fn escape(text: &str) -> String {
    if text.is_empty() {
        return "''".into();
    }
    let mut out = String::with_capacity(text.len() * 2);
    let mut quoted = false;
    for byte in text.bytes() {
        let literal = byte.is_ascii_alphanumeric() || b",-./@_".contains(&byte);
        let needs_quotes = b" !\"#$%&()*+:;<=>?[]^`{|}~".contains(&byte);
        let c_escape = match byte {
            0x07 => Some("\\a"),
            0x08 => Some("\\b"),
            b'\t' => Some("\\t"),
            b'\n' => Some("\\n"),
            0x0b => Some("\\v"),
            0x0c => Some("\\f"),
            b'\r' => Some("\\r"),
            b'\'' => Some("\\'"),
            b'\\' => Some("\\\\"),
            _ => None,
        };
        if literal {
            out.push(char::from(byte));
        } else if needs_quotes {
            out.push(char::from(byte));
            quoted = true;
        } else if let Some(e) = c_escape {
            out.push_str(e);
            quoted = true;
        } else {
            out.push_str(&format!("\\x{byte:02x}"));
            quoted = true;
        }
    }
    if quoted { format!("$'{out}'") } else { out }
}

/// Go's `%q` (`strconv.Quote`) for the paths the writer formats with it.
pub fn go_quote(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push_str(&format!("\\x{:02x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Go's `regexp.QuoteMeta`.
pub fn quote_meta(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        if r"\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Go's `path.Join`: the non-empty parts joined by `/`, then cleaned.
pub fn join(parts: &[&str]) -> String {
    let joined: Vec<&str> = parts.iter().copied().filter(|p| !p.is_empty()).collect();
    if joined.is_empty() {
        return String::new();
    }
    clean(&joined.join("/"))
}

/// Go's `path.Clean`.
pub fn clean(path: &str) -> String {
    let rooted = path.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if parts.last().is_some_and(|p| *p != "..") {
                    parts.pop();
                } else if !rooted {
                    parts.push("..");
                }
            }
            other => parts.push(other),
        }
    }
    let body = parts.join("/");
    match (rooted, body.is_empty()) {
        (true, _) => format!("/{body}"),
        (false, true) => ".".into(),
        (false, false) => body,
    }
}

/// Go's `filepath.Rel` for two absolute, clean paths.
pub fn relative(base: &str, target: &str) -> String {
    let base: Vec<&str> = base.split('/').filter(|p| !p.is_empty()).collect();
    let target: Vec<&str> = target.split('/').filter(|p| !p.is_empty()).collect();
    let common = base.iter().zip(&target).take_while(|(a, b)| a == b).count();
    let mut parts: Vec<&str> = vec![".."; base.len() - common];
    parts.extend(&target[common..]);
    if parts.is_empty() {
        ".".into()
    } else {
        parts.join("/")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_clean_join_and_relate_as_go_does() {
        assert_eq!(join(&["/builds", "/group/app"]), "/builds/group/app");
        assert_eq!(clean("/a/../../b/./c/"), "/b/c");
        assert_eq!(
            relative("/builds/group/app", "/cache/group/app/k/cache.zip"),
            "../../../cache/group/app/k/cache.zip"
        );
    }
}
