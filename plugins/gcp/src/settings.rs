//! The pool's `plugin_config`, read with every problem at once.

use super::*;

/// The pool's `plugin_config`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Settings {
    /// The project id.
    pub(crate) project: String,
    /// The zone of a zonal group (`us-central1-a`); give this or `region`.
    #[serde(default)]
    pub(crate) zone: Option<String>,
    /// The region of a regional group (`us-central1`); give this or `zone`.
    #[serde(default)]
    pub(crate) region: Option<String>,
    /// The managed instance group's name.
    pub(crate) name: String,
    /// The most instances the plugin lets the group grow to (a MIG has no maximum of its own).
    pub(crate) max_size: u32,
    /// The API's root, default `https://compute.googleapis.com` (emulators, private endpoints).
    #[serde(default)]
    pub(crate) endpoint: Option<String>,
    /// The pool credential (kind `gcp`) whose tokens the host adds.
    #[serde(default = "default_credential")]
    pub(crate) credential: String,
    /// SSH user for connect-info of Linux instances.
    #[serde(default = "default_user")]
    pub(crate) username: String,
}

pub(crate) fn default_credential() -> String {
    "gcp".to_string()
}
pub(crate) fn default_user() -> String {
    "flotilla".to_string()
}

/// A zone like `us-central1-a` or a region like `us-central1`: lowercase words and digits
/// joined by dashes, `parts` of them.
pub(crate) fn location_ok(text: &str, parts: usize) -> bool {
    let words: Vec<&str> = text.split('-').collect();
    words.len() == parts
        && words.iter().all(|w| {
            !w.is_empty()
                && w.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        })
}

/// A project id (6–30 characters; lowercase letters, digits, dashes), optionally
/// domain-scoped (`example.com:my-project`).
pub(crate) fn project_ok(project: &str) -> bool {
    let id = project.rsplit(':').next().unwrap_or_default();
    (6..=30).contains(&id.len())
        && id.starts_with(|c: char| c.is_ascii_lowercase())
        && !id.ends_with('-')
        && id
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && project
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-.:".contains(c))
}

/// Reads the settings, reporting every problem at once: each unknown key, a missing or
/// mistyped key, and each bad value.
pub(crate) fn parse_settings(text: &str) -> Result<Settings, Error> {
    let (s, mut problems) = flotilla_guest::settings::read::<Settings>(text)
        .map_err(|p| Error::InvalidConfig(p.join("; ")))?;
    if !project_ok(&s.project) {
        problems.push(format!(
            "project: {:?} is not a project id (6-30 lowercase letters, digits, dashes)",
            capped(&s.project)
        ));
    }
    match (&s.zone, &s.region) {
        (Some(_), Some(_)) => {
            problems.push("zone, region: give one, not both".to_string());
        }
        (None, None) => problems.push(
            "zone, region: give `zone` for a zonal group or `region` for a regional one"
                .to_string(),
        ),
        (Some(z), None) if !location_ok(z, 3) => problems.push(format!(
            "zone: {:?} is not a zone like us-central1-a",
            capped(z)
        )),
        (None, Some(r)) if !location_ok(r, 2) => problems.push(format!(
            "region: {:?} is not a region like us-central1",
            capped(r)
        )),
        _ => {}
    }
    let name_ok = valid_name(&s.name)
        && s.name.starts_with(|c: char| c.is_ascii_lowercase())
        && !s.name.ends_with('-');
    if !name_ok {
        problems.push(format!(
            "name: {:?} is not a group name (1-63 lowercase letters, digits, dashes)",
            capped(&s.name)
        ));
    }
    let (limit, kind) = if s.region.is_some() {
        (REGIONAL_MAX_SIZE, "regional")
    } else {
        (ZONAL_MAX_SIZE, "zonal")
    };
    if s.max_size == 0 || s.max_size > limit {
        problems.push(format!(
            "max_size: must be 1-{limit} (Compute's limit on a {kind} group's size)"
        ));
    }
    if let Some(e) = &s.endpoint
        && let Err(why) = flotilla_guest_http::split_url(e)
    {
        problems.push(format!("endpoint: {why}"));
    }
    if s.credential.is_empty() {
        problems.push("credential: must name a pool credential".to_string());
    }
    if s.username.is_empty() || s.username.len() > 32 {
        problems.push("username: must be 1-32 characters".to_string());
    }
    if problems.is_empty() {
        Ok(s)
    } else {
        Err(Error::InvalidConfig(problems.join("; ")))
    }
}
