//! `azure` → a virtual machine scale set, managed by the azure plugin. The driver's options
//! are those of Docker Machine's Azure driver
//! (<https://github.com/docker/docs/blob/173d3c65f8e7df2a8c0323594419c18086fc3a30/machine/drivers/azure.md>).

use flotilla_validate::KeyPath;

use super::{
    CloudPool, DriverOptions, GroupSpec, Runner, argv, option, quote, shell_line, with_option,
};

/// The driver's defaults, where the scale set needs a value.
const DEFAULTS: [(&str, &str); 6] = [
    ("location", "westus"),
    ("resource-group", "docker-machine"),
    ("size", "Standard_A2"),
    ("vnet", "docker-machine-vnet"),
    ("subnet", "docker-machine"),
    ("ssh-user", "docker-user"),
];

/// The actions of the azure plugin's custom role (plugins/azure/README.md).
const ACTIONS: [&str; 9] = [
    "Microsoft.Compute/virtualMachineScaleSets/read",
    "Microsoft.Compute/virtualMachineScaleSets/write",
    "Microsoft.Compute/virtualMachineScaleSets/delete/action",
    "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read",
    "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/networkInterfaces/read",
    "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/networkInterfaces/ipConfigurations/publicIPAddresses/read",
    "Microsoft.Compute/virtualMachines/read",
    "Microsoft.Network/networkInterfaces/read",
    "Microsoft.Network/publicIPAddresses/read",
];

/// An `azure` option that is one flag of `az vmss create`, from its own value.
fn create_flag(k: &str, value: &str) -> Option<[String; 2]> {
    let name = match k {
        "image" => "--image",
        "subnet-prefix" => "--subnet-address-prefix",
        "storage-type" => "--storage-sku",
        "disk-size" => "--os-disk-size-gb",
        "nsg" => "--nsg",
        "accelerated-networking" => {
            return Some(["--accelerated-networking".into(), "true".into()]);
        }
        _ => return None,
    };
    Some([name.into(), value.into()])
}

/// Why an `azure` option has no place on a scale set, when it has none.
fn unmapped_reason(k: &str) -> Option<&'static str> {
    Some(match k {
        "static-public-ip" | "dns" => {
            "a static public address or DNS label belongs to one machine; scale set instances get their own (add --public-ip-per-vm for public ones)"
        }
        "availability-set" | "update-domain-count" | "fault-domain-count" => {
            "a scale set spreads its instances over fault domains itself; it takes no availability set"
        }
        "client-id" | "client-secret" => {
            "credentials are not copied: the pool's azure credential uses workload identity, a managed identity, or a client secret from the environment, with the role printed below"
        }
        "environment" => {
            "sovereign clouds: set the plugin's endpoint and the credential's authority_host by hand"
        }
        "docker-port" | "open-port" => {
            "Flotilla reaches Docker Engine over SSH, not a TCP port; open ports with the set's network security group"
        }
        _ => return None,
    })
}

/// The arguments of `az vmss create` every scale set gets: where it is, its size and login,
/// zero instances, no overprovisioning, manual upgrades.
fn create_args(
    one: &dyn Fn(&str) -> Option<String>,
    group: &str,
    set: &str,
    user: &str,
) -> Vec<String> {
    vec![
        "--resource-group".into(),
        group.into(),
        "--name".into(),
        set.into(),
        "--orchestration-mode".into(),
        "Uniform".into(),
        "--location".into(),
        one("location").unwrap_or_default(),
        "--vm-sku".into(),
        one("size").unwrap_or_default(),
        "--instance-count".into(),
        "0".into(),
        "--disable-overprovision".into(),
        "--upgrade-policy-mode".into(),
        "Manual".into(),
        "--admin-username".into(),
        user.into(),
        "--vnet-name".into(),
        one("vnet").unwrap_or_default(),
        "--subnet".into(),
        one("subnet").unwrap_or_default(),
    ]
}

impl Runner<'_> {
    /// `azure` options → a Uniform scale set (manual scale, no overprovisioning, manual
    /// upgrades), and the azure plugin.
    pub(super) fn azure(
        &mut self,
        opts: &DriverOptions,
        options_at: &KeyPath,
        pool: &str,
        max: u32,
    ) -> CloudPool {
        let one = |k: &str| {
            option(opts, "azure-", k).or_else(|| {
                DEFAULTS
                    .iter()
                    .find(|(d, _)| *d == k)
                    .map(|(_, v)| (*v).to_string())
            })
        };
        let set = format!("flotilla-{pool}");
        let group = one("resource-group").unwrap_or_default();
        let user = one("ssh-user").unwrap_or_default();
        // `az vmss create`'s arguments, one per element: shell_line quotes each.
        let mut create = create_args(&one, &group, &set, &user);
        let subscription = self.azure_options(opts, options_at, &mut create);
        let role = serde_json::json!({
            "Name": "Flotilla scale set operator",
            "Description": "Lets Flotilla read one scale set, change its capacity and delete its instances.",
            "Actions": ACTIONS,
            "NotActions": [],
            "AssignableScopes": [format!("/subscriptions/{subscription}/resourceGroups/{group}")],
        });
        let vmss = [
            argv(&["az", "vmss", "create", "--subscription", &subscription]),
            create,
        ]
        .concat();
        let commands = vec![
            shell_line(&vmss),
            shell_line(&[
                "az",
                "role",
                "definition",
                "create",
                "--role-definition",
                &role.to_string(),
            ]),
        ];
        let hosts = "[\"https://management.azure.com\"]";
        CloudPool {
            group: GroupSpec {
                cloud: "azure".into(),
                commands,
                permissions: serde_json::to_string_pretty(&role).unwrap_or_default(),
            },
            sandbox: format!(
                "allowed_outbound_hosts = {hosts}\n\n[[pool.credentials]]\nname = \"azure\"\nkind = \"azure\"\nhosts = {hosts}\n"
            ),
            settings: format!(
                "\n[pool.plugin_config]\nsubscription_id = {}\nresource_group = {}\nname = {}\nmax_size = {}\ncredential = \"azure\"\nusername = {}\n",
                quote(&subscription),
                quote(&group),
                quote(&set),
                max.max(1),
                quote(&user)
            ),
        }
    }

    /// The walk over the `azure` options: their flags go on `create`, every option that maps
    /// to nothing is reported; the subscription is answered.
    fn azure_options(
        &mut self,
        opts: &DriverOptions,
        options_at: &KeyPath,
        create: &mut Vec<String>,
    ) -> String {
        let mut subscription = "<subscription-id>".to_string();
        for (k, value, at) in
            self.driver_options(opts, "azure-", "the image or the scale set's custom data")
        {
            if let Some(flag) = create_flag(k, value) {
                create.extend(flag);
                continue;
            }
            if let Some(reason) = unmapped_reason(k) {
                self.unmapped(&at, reason);
                continue;
            }
            match k {
                "subscription-id" => subscription = value.clone(),
                "location" | "resource-group" | "size" | "vnet" | "subnet" | "ssh-user"
                | "managed-disks" => {}
                "custom-data" => {
                    self.changed(
                        &at,
                        format!("a file: the scale set's custom data is read from it at creation ({value})"),
                    );
                    create.extend(["--custom-data".to_string(), value.clone()]);
                }
                "no-public-ip" => self.changed(
                    &at,
                    "scale set instances get no public address unless --public-ip-per-vm is given; none is written",
                ),
                "use-private-ip" | "private-ip-address" => self.changed(
                    &at,
                    "Flotilla connects to the instance's private address whenever the plugin reports one; a fixed private address belongs to one machine",
                ),
                _ => self.unmapped(
                    &at,
                    "no scale set equivalent known to this migration; set it on the scale set by hand",
                ),
            }
        }
        if !opts.contains_key("azure-image") {
            self.changed(
                &with_option(options_at, "azure-image"),
                "unset: Docker Machine picked an Ubuntu image and installed Docker Engine; give the set an image with Docker Engine",
            );
            create.extend(["--image".to_string(), "<image-with-docker>".to_string()]);
        }
        if !opts.contains_key("azure-subscription-id") {
            self.changed(
                &with_option(options_at, "azure-subscription-id"),
                "unset: put the subscription id in subscription_id and in the commands",
            );
        }
        subscription
    }
}
