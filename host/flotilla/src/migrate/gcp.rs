//! `google` → a Compute Engine instance template and managed instance group, managed by the
//! gcp plugin. The driver's options are those of Docker Machine's GCE driver
//! (<https://github.com/docker/docs/blob/173d3c65f8e7df2a8c0323594419c18086fc3a30/machine/drivers/gce.md>).

use flotilla_validate::KeyPath;

use super::{
    CloudPool, DriverOptions, GroupSpec, Runner, argv, option, quote, shell_line, with_option,
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

/// A `google` option that is one or two flags of the instance template, from its own value.
fn template_flags(k: &str, value: &str) -> Option<Vec<String>> {
    Some(match k {
        "machine-image" => image_flags(value).unwrap_or_else(|| vec![format!("--image={value}")]),
        "disk-size" => vec![format!("--boot-disk-size={value}GB")],
        "disk-type" => vec![format!("--boot-disk-type={value}")],
        "network" => vec![format!("--network={value}")],
        "subnetwork" => vec![format!("--subnet={value}")],
        "tags" => vec![format!("--tags={value}")],
        "preemptible" => vec!["--preemptible".into()],
        "use-internal-ip-only" => vec!["--no-address".into()],
        "service-account" => vec![format!("--service-account={value}")],
        "scopes" => vec![format!("--scopes={value}")],
        "no-service-account" => vec!["--no-service-account".into(), "--no-scopes".into()],
        "accelerator" => vec![
            format!("--accelerator={value}"),
            "--maintenance-policy=TERMINATE".into(),
        ],
        "min-cpu-platform" => vec![format!("--min-cpu-platform={value}")],
        _ => return None,
    })
}

/// Why a `google` option has no place in a group, when it has none.
fn unmapped_reason(k: &str) -> Option<&'static str> {
    Some(match k {
        "auth-encoded-json" => {
            "credentials are not copied: the pool's gcp credential mints tokens from a service-account key file, workload identity or the metadata server, with the role printed below"
        }
        "address" => {
            "a static external address belongs to one machine; the instances of a group get ephemeral ones (or none with --no-address)"
        }
        "use-existing" => {
            "Flotilla does not adopt single existing VMs; the group creates its instances from the template"
        }
        "open-port" => {
            "firewall rules are not part of the group: create a rule for the template's network tags"
        }
        k if k.starts_with("operation-backoff") => {
            "the plugin follows Compute operations itself and the host backs off throttled calls"
        }
        _ => return None,
    })
}

/// What the `google` options make: the template's flags, the project, where the group is, and
/// settings lines for the plugin.
struct Machine {
    template: Vec<String>,
    project: String,
    place: Location,
    notes: Vec<String>,
}

/// The commands that create the template, the group (empty) and the plugin's role.
fn group_commands(group: &str, machine: &Machine) -> Vec<String> {
    let where_flags = match &machine.place {
        Location::Zone(z) => vec![format!("--zone={z}")],
        Location::Region(r) => vec![
            format!("--region={r}"),
            "--instance-redistribution-type=NONE".to_string(),
        ],
    };
    let project_flag = format!("--project={}", machine.project);
    let create_template = [
        argv(&[
            "gcloud",
            "compute",
            "instance-templates",
            "create",
            group,
            &project_flag,
        ]),
        machine.template.clone(),
    ]
    .concat();
    let create_group = [
        argv(&[
            "gcloud",
            "compute",
            "instance-groups",
            "managed",
            "create",
            group,
            &project_flag,
        ]),
        where_flags,
        vec![format!("--template={group}"), "--size=0".to_string()],
    ]
    .concat();
    vec![
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
    ]
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
    ) -> CloudPool {
        let group = format!("flotilla-{pool}");
        let machine = self.gcp_machine(opts, options_at);
        let role = serde_json::json!({
            "title": "Flotilla MIG plugin",
            "stage": "GA",
            "includedPermissions": PERMISSIONS,
        });
        let spec = GroupSpec {
            cloud: "gcp".into(),
            commands: group_commands(&group, &machine),
            permissions: serde_json::to_string_pretty(&role).unwrap_or_default(),
        };
        let hosts = "[\"https://compute.googleapis.com\"]";
        let sandbox = format!(
            "allowed_outbound_hosts = {hosts}\n\n[[pool.credentials]]\nname = \"gcp\"\nkind = \"gcp\"\nscopes = [\"https://www.googleapis.com/auth/compute\"]\nhosts = {hosts}\n"
        );
        let settings_location = match &machine.place {
            Location::Zone(z) => format!("zone = {}\n", quote(z)),
            Location::Region(r) => format!("region = {}\n", quote(r)),
        };
        let mut settings = format!(
            "\n[pool.plugin_config]\nproject = {}\n{settings_location}name = {}\nmax_size = {}\ncredential = \"gcp\"\n",
            quote(&machine.project),
            quote(&group),
            max.max(1)
        );
        for n in machine.notes {
            settings.push_str(&n);
        }
        CloudPool {
            group: spec,
            sandbox,
            settings,
        }
    }

    /// The walk over the `google` options; every option that maps to nothing is reported.
    fn gcp_machine(&mut self, opts: &DriverOptions, options_at: &KeyPath) -> Machine {
        let one = |k: &str| option(opts, "google-", k);
        let mut machine = Machine {
            template: vec![format!(
                "--machine-type={}",
                one("machine-type").unwrap_or_else(|| DEFAULT_MACHINE_TYPE.into())
            )],
            project: "<project-id>".to_string(),
            place: Location::Zone(DEFAULT_ZONE.into()),
            notes: Vec::new(),
        };
        for (k, value, at) in self.driver_options(
            opts,
            "google-",
            "the image or the instance template's startup script",
        ) {
            if let Some(flags) = template_flags(k, value) {
                machine.template.extend(flags);
                continue;
            }
            if let Some(reason) = unmapped_reason(k) {
                self.unmapped(&at, reason);
                continue;
            }
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
                "project" => machine.project = value.clone(),
                "zone" => match location(value) {
                    Some(l @ Location::Region(_)) => {
                        self.changed(
                            &at,
                            format!("{value:?} is a region: the group is a regional managed instance group over its zones"),
                        );
                        machine.place = l;
                    }
                    Some(l) => machine.place = l,
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
                "username" => machine.notes.push(format!("username = {}\n", quote(value))),
                "use-internal-ip" => self.changed(
                    &at,
                    "Flotilla connects to the instance's internal address whenever the plugin reports one",
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
            machine.template.push("--image=<image-with-docker>".into());
        }
        if !opts.contains_key("google-project") {
            self.changed(
                &with_option(options_at, "google-project"),
                "unset: put the project id in project and in the commands",
            );
        }
        machine
    }
}
