//! `google` → a Compute Engine instance template and managed instance group, managed by the
//! gcp plugin. The driver's options are those of Docker Machine's GCE driver
//! (<https://github.com/docker/docs/blob/173d3c65f8e7df2a8c0323594419c18086fc3a30/machine/drivers/gce.md>).

use flotilla_validate::KeyPath;

use super::{
    DriverOptions, GroupSpec, Options, Runner, argv, option, quote, shell_line, with_option,
};

/// A Compute Engine project id: 6 to 30 lowercase letters, digits and hyphens, from a letter
/// and not ending in a hyphen; a domain-scoped one (`example.com:my-project`) too.
fn is_project_id(value: &str) -> bool {
    let id = value.rsplit_once(':').map_or(value, |(domain, id)| {
        if domain.is_empty()
            || !domain
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
        {
            ""
        } else {
            id
        }
    });
    (6..=30).contains(&id.len())
        && id.starts_with(|c: char| c.is_ascii_lowercase())
        && !id.ends_with('-')
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// The driver's defaults, where Flotilla's group needs a value.
const DEFAULT_ZONE: &str = "us-central1-a";
const DEFAULT_MACHINE_TYPE: &str = "n1-standard-1";

/// The permissions of the gcp plugin (plugins/gcp/README.md).
const PERMISSIONS: [&str; 5] = [
    "compute.instanceGroupManagers.get",
    "compute.instanceGroupManagers.update",
    "compute.instances.get",
    "compute.regionOperations.get",
    "compute.zoneOperations.get",
];

/// `--image`/`--image-family` and `--image-project` of an image given as a URL or a
/// `PROJECT/global/images/[family/]NAME` path; `None` for a bare name.
fn image_flags(image: &str) -> Option<Vec<String>> {
    let path = image
        .split_once("projects/")
        .map_or(image, |(_, rest)| rest);
    let parts: Vec<&str> = path.split('/').collect();
    match parts.as_slice() {
        [project, "global", "images", "family", family] => Some(vec![
            format!("--image-family={family}"),
            format!("--image-project={project}"),
        ]),
        [project, "global", "images", name] => Some(vec![
            format!("--image={name}"),
            format!("--image-project={project}"),
        ]),
        _ => None,
    }
}

/// A zone (`us-central1-a`) or a region (`us-central1`), as a location of the group.
enum Location {
    Zone(String),
    Region(String),
}

fn location(value: &str) -> Option<Location> {
    let words: Vec<&str> = value.split('-').collect();
    let ok = words.iter().all(|w| {
        !w.is_empty()
            && w.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
    });
    match (ok, words.len()) {
        (true, 3) => Some(Location::Zone(value.to_string())),
        (true, 2) => Some(Location::Region(value.to_string())),
        _ => None,
    }
}

impl Runner<'_> {
    /// `google` options → an instance template and a managed instance group, and the gcp
    /// plugin.
    pub(super) fn gcp(
        &mut self,
        opts: &DriverOptions,
        options_at: &KeyPath,
        pool: &str,
        max: u32,
        options: &Options,
    ) -> Option<(String, String, String)> {
        let one = |k: &str| option(opts, "google-", k);
        let group = format!("flotilla-{pool}");
        let mut template = vec![format!(
            "--machine-type={}",
            one("machine-type").unwrap_or_else(|| DEFAULT_MACHINE_TYPE.into())
        )];
        let mut notes = Vec::new();
        let mut project = "<project-id>".to_string();
        let mut place = Location::Zone(DEFAULT_ZONE.into());
        for (k, value, at) in self.driver_options(
            opts,
            "google-",
            "the image or the instance template's startup script",
        ) {
            let placeholder = value.chars().any(|c| c.is_ascii_uppercase());
            match k {
                "project" if placeholder => self.changed(
                    &at,
                    format!("{value:?} is a placeholder: put the real project id in project and in the commands"),
                ),
                "project" if !is_project_id(value) => self.changed(
                    &at,
                    format!("{value:?} is not a project id (6 to 30 lowercase letters, digits and hyphens, from a letter, optionally after a domain and a colon): put the real one in project and in the commands"),
                ),
                "project" => project = value.clone(),
                "zone" => match location(value) {
                    Some(l @ Location::Region(_)) => {
                        self.changed(
                            &at,
                            format!("{value:?} is a region: the group is a regional managed instance group over its zones"),
                        );
                        place = l;
                    }
                    Some(l) => place = l,
                    None => self.changed(
                        &at,
                        format!("{value:?} is not a zone like {DEFAULT_ZONE}: put the real zone in zone and in the commands (written as {DEFAULT_ZONE})"),
                    ),
                },
                "machine-type" if placeholder => self.changed(
                    &at,
                    format!("{value:?} is a placeholder: put the real machine type in the template command"),
                ),
                "machine-type" => {}
                "machine-image" => match image_flags(value) {
                    Some(flags) => template.extend(flags),
                    None => template.push(format!("--image={value}")),
                },
                "disk-size" => template.push(format!("--boot-disk-size={value}GB")),
                "disk-type" => template.push(format!("--boot-disk-type={value}")),
                "network" => template.push(format!("--network={value}")),
                "subnetwork" => template.push(format!("--subnet={value}")),
                "tags" => template.push(format!("--tags={value}")),
                "preemptible" => template.push("--preemptible".into()),
                "use-internal-ip-only" => template.push("--no-address".into()),
                "service-account" => template.push(format!("--service-account={value}")),
                "scopes" => template.push(format!("--scopes={value}")),
                "no-service-account" => {
                    template.push("--no-service-account".into());
                    template.push("--no-scopes".into());
                }
                "accelerator" => {
                    template.push(format!("--accelerator={value}"));
                    template.push("--maintenance-policy=TERMINATE".into());
                }
                "min-cpu-platform" => template.push(format!("--min-cpu-platform={value}")),
                "username" => notes.push(format!("username = {}\n", quote(value))),
                "use-internal-ip" => self.changed(
                    &at,
                    "Flotilla connects to the instance's internal address whenever the plugin reports one",
                ),
                "auth-encoded-json" => self.unmapped(
                    &at,
                    "credentials are not copied: the pool's gcp credential mints tokens from a service-account key file, workload identity or the metadata server, with the role printed below",
                ),
                "address" => self.unmapped(
                    &at,
                    "a static external address belongs to one machine; the instances of a group get ephemeral ones (or none with --no-address)",
                ),
                "use-existing" => self.unmapped(
                    &at,
                    "Flotilla does not adopt single existing VMs; the group creates its instances from the template",
                ),
                "open-port" => self.unmapped(
                    &at,
                    "firewall rules are not part of the group: create a rule for the template's network tags",
                ),
                k if k.starts_with("operation-backoff") => self.unmapped(
                    &at,
                    "the plugin follows Compute operations itself and the host backs off throttled calls",
                ),
                _ => self.unmapped(
                    &at,
                    "no instance-template or group equivalent known to this migration; set it in the template by hand",
                ),
            }
        }
        if !opts.contains_key("google-machine-image") {
            self.changed(
                &with_option(options_at, "google-machine-image"),
                "unset: Docker Machine picked an Ubuntu image and installed Docker Engine; give the template an image with Docker Engine",
            );
            template.push("--image=<image-with-docker>".into());
        }
        if !opts.contains_key("google-project") {
            self.changed(
                &with_option(options_at, "google-project"),
                "unset: put the project id in project and in the commands",
            );
        }
        let (where_flags, settings_location) = match &place {
            Location::Zone(z) => (
                vec![format!("--zone={z}")],
                format!("zone = {}\n", quote(z)),
            ),
            Location::Region(r) => (
                vec![
                    format!("--region={r}"),
                    "--instance-redistribution-type=NONE".to_string(),
                ],
                format!("region = {}\n", quote(r)),
            ),
        };
        let project_flag = format!("--project={project}");
        let create_template = [
            argv(&[
                "gcloud",
                "compute",
                "instance-templates",
                "create",
                &group,
                &project_flag,
            ]),
            template,
        ]
        .concat();
        let create_group = [
            argv(&[
                "gcloud",
                "compute",
                "instance-groups",
                "managed",
                "create",
                &group,
                &project_flag,
            ]),
            where_flags,
            vec![format!("--template={group}"), "--size=0".to_string()],
        ]
        .concat();
        let commands = vec![
            shell_line(&create_template),
            shell_line(&create_group),
            shell_line(&[
                "gcloud",
                "iam",
                "roles",
                "create",
                "flotillaMig",
                &project_flag,
                "--title=Flotilla MIG plugin",
                &format!("--permissions={}", PERMISSIONS.join(",")),
            ]),
        ];
        let role = serde_json::json!({
            "title": "Flotilla MIG plugin",
            "stage": "GA",
            "includedPermissions": PERMISSIONS,
        });
        self.report.group = Some(GroupSpec {
            cloud: "gcp".into(),
            commands,
            permissions: serde_json::to_string_pretty(&role).unwrap_or_default(),
        });
        let plugin = self.plugin_for("gcp", options)?;
        let hosts = "[\"https://compute.googleapis.com\"]";
        let sandbox = format!(
            "allowed_outbound_hosts = {hosts}\n\n[[pool.credentials]]\nname = \"gcp\"\nkind = \"gcp\"\nscopes = [\"https://www.googleapis.com/auth/compute\"]\nhosts = {hosts}\n"
        );
        let mut settings = format!(
            "\n[pool.plugin_config]\nproject = {}\n{settings_location}name = {}\nmax_size = {}\ncredential = \"gcp\"\n",
            quote(&project),
            quote(&group),
            max.max(1)
        );
        for n in notes {
            settings.push_str(&n);
        }
        Some((sandbox, settings, plugin))
    }
}
