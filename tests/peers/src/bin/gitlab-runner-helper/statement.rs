//! The artifacts provenance statement `artifacts-uploader` adds when the script passes
//! `--generate-artifacts-metadata` (`shells/abstract.go` `generateArtifactsMetadataArgs`,
//! for zip artifacts with `RUNNER_GENERATE_ARTIFACTS_METADATA`): an in-toto statement with a
//! SLSA v1 provenance predicate, written to `<name>-metadata.json` in the project directory
//! and archived with the artifacts (`commands/helpers/artifact_metadata.go`
//! `generateStatementToFile`). Subjects are the selected regular files with their SHA-256.
//!
//! Owns: the statement's content. Must not know: uploading.

use std::fs::File;
use std::io::Read;

use serde_json::{Map, Value, json};

use crate::ctx::{Ctx, path_error};
use crate::flags::{Flag, Kind, Parsed, flag};
use crate::paths::Selection;

/// `artifactStatementGenerator`'s flags.
pub const FLAGS: &[Flag] = &[
    flag("generate-artifacts-metadata", Kind::Switch),
    flag("runner-id", Kind::Integer),
    flag("repo-url", Kind::Text),
    flag("repo-digest", Kind::Text),
    flag("job-name", Kind::Text),
    flag("executor-name", Kind::Text),
    flag("runner-name", Kind::Text),
    flag("metadata-parameter", Kind::Texts),
    flag("started-at", Kind::Text),
    flag("ended-at", Kind::Text),
    flag("schema-version", Kind::Text),
];

/// Writes the statement; its path relative to the project directory.
pub fn generate(
    ctx: &mut Ctx,
    parsed: &Parsed,
    name: &str,
    selection: &Selection,
    job_id: i64,
) -> Result<String, String> {
    let started = check_rfc3339(&parsed.text("started-at"))?;
    let ended = check_rfc3339(&parsed.text("ended-at"))?;
    let schema = parsed.text("schema-version");
    if schema != "v1" {
        ctx.log.warn(&format!(
            "Unknown SLSA provenance version {schema}, defaulting to v1"
        ));
    }
    let mut subjects = Vec::new();
    for file in selection.files.keys() {
        let path = ctx.wd.join(file);
        if !std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file()) {
            continue;
        }
        subjects.push(json!({ "name": file, "digest": { "sha256": sha256_file(&path, file)? } }));
    }
    let statement = json!({
        "_type": "https://in-toto.io/Statement/v0.1",
        "subject": subjects,
        "predicateType": "https://slsa.dev/provenance/v1",
        "predicate": predicate(parsed, job_id, &started, &ended),
    });
    let text = serde_json::to_string_pretty(&statement).map_err(|e| e.to_string())?;
    let relative = format!("{name}-metadata.json");
    std::fs::write(ctx.wd.join(&relative), text).map_err(|e| path_error("open", &relative, &e))?;
    Ok(relative)
}

/// `generateSLSAv1Predicate`.
fn predicate(parsed: &Parsed, job_id: i64, started: &str, ended: &str) -> Value {
    let repo_url = parsed.text("repo-url");
    // `version()`: the version when it starts with "v", else the revision.
    let version = crate::gitlab::REVISION;
    let mut external = Map::new();
    for parameter in parsed.texts("metadata-parameter") {
        external.insert(parameter, Value::String(String::new()));
    }
    external.insert("entryPoint".into(), Value::String(parsed.text("job-name")));
    external.insert("source".into(), Value::String(repo_url.clone()));
    let runner_id = parsed.integer("runner-id").unwrap_or(0);
    json!({
        "buildDefinition": {
            "buildType": format!("https://gitlab.com/gitlab-org/gitlab-runner/-/blob/{version}/PROVENANCE.md"),
            "externalParameters": external,
            "internalParameters": {
                "name": parsed.text("runner-name"),
                "executor": parsed.text("executor-name"),
                "architecture": crate::gitlab::go_arch(),
                "job": job_id.to_string(),
            },
            "resolvedDependencies": [{ "uri": repo_url, "digest": { "sha256": parsed.text("repo-digest") } }],
        },
        "runDetails": {
            "builder": {
                "id": format!("{repo_url}/-/runners/{runner_id}"),
                "version": { "gitlab-runner": version },
            },
            "metadata": { "invocationId": job_id.to_string(), "startedOn": started, "finishedOn": ended },
        },
    })
}

/// `time.Parse(time.RFC3339, …)` accepting the shape the script writes; returned in UTC
/// form when it already is, as given otherwise.
fn check_rfc3339(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let digits = |range: std::ops::Range<usize>| {
        bytes
            .get(range)
            .is_some_and(|s| s.iter().all(u8::is_ascii_digit))
    };
    let shaped = digits(0..4)
        && bytes.get(4) == Some(&b'-')
        && digits(5..7)
        && bytes.get(7) == Some(&b'-')
        && digits(8..10)
        && bytes.get(10) == Some(&b'T')
        && digits(11..13)
        && digits(14..16)
        && digits(17..19);
    if !shaped {
        return Err(format!(
            "parsing time {text:?} as \"2006-01-02T15:04:05Z07:00\": cannot parse {text:?} as \"2006\""
        ));
    }
    Ok(text.to_string())
}

fn sha256_file(path: &std::path::Path, shown: &str) -> Result<String, String> {
    let mut file = File::open(path).map_err(|e| path_error("open", shown, &e))?;
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let n = file
            .read(&mut buffer)
            .map_err(|e| path_error("read", shown, &e))?;
        if n == 0 {
            break;
        }
        context.update(buffer.get(..n).unwrap_or(&[]));
    }
    Ok(context
        .finish()
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_statement_lists_regular_files_with_their_sha256() {
        let (_dir, mut ctx, _captured) = crate::testkit::project(&[]);
        std::fs::write(ctx.wd.join("a.txt"), "abc").expect("file");
        let mut selection = Selection::default();
        selection.files.insert("a.txt".into(), None);
        let list = crate::testkit::args(&[
            "--started-at",
            "2024-01-01T00:00:00Z",
            "--ended-at",
            "2024-01-01T00:01:00Z",
            "--schema-version",
            "v1",
            "--repo-url",
            "https://g/p",
            "--metadata-parameter",
            "CI",
        ]);
        let parsed = crate::flags::parse(FLAGS, &list, &ctx.env).expect("flags");
        let file = generate(&mut ctx, &parsed, "artifacts", &selection, 5).expect("statement");
        assert_eq!(file, "artifacts-metadata.json");
        let text = std::fs::read_to_string(ctx.wd.join(&file)).expect("written");
        let value: Value = serde_json::from_str(&text).expect("json");
        assert_eq!(
            value["subject"][0]["digest"]["sha256"],
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            value["predicate"]["buildDefinition"]["externalParameters"]["CI"],
            ""
        );
        assert_eq!(
            value["predicate"]["runDetails"]["metadata"]["invocationId"],
            "5"
        );
    }
}
