//! `azure` → a virtual machine scale set, managed by the azure plugin. The driver's options
//! are those of Docker Machine's Azure driver
//! (<https://github.com/docker/docs/blob/173d3c65f8e7df2a8c0323594419c18086fc3a30/machine/drivers/azure.md>).

use flotilla_validate::KeyPath;

use super::{
    DriverOptions, GroupSpec, Options, Runner, argv, option, quote, shell_line, with_option,
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

impl Runner<'_> {
    /// `azure` options → a Uniform scale set (manual scale, no overprovisioning, manual
    /// upgrades), and the azure plugin.
    pub(super) fn azure(
        &mut self,
        opts: &DriverOptions,
        options_at: &KeyPath,
        pool: &str,
        max: u32,
        options: &Options,
    ) -> Option<(String, String, String)> {
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
        let mut create: Vec<String> = vec![
            "--resource-group".into(),
            group.clone(),
            "--name".into(),
            set.clone(),
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
            user.clone(),
            "--vnet-name".into(),
            one("vnet").unwrap_or_default(),
            "--subnet".into(),
            one("subnet").unwrap_or_default(),
        ];
        let flag = |create: &mut Vec<String>, name: &str, value: &str| {
            create.push(name.to_string());
            create.push(value.to_string());
        };
        let mut subscription = "<subscription-id>".to_string();
        for (k, value, at) in
            self.driver_options(opts, "azure-", "the image or the scale set's custom data")
        {
            match k {
                "subscription-id" => subscription = value.clone(),
                "location" | "resource-group" | "size" | "vnet" | "subnet" | "ssh-user" => {}
                "image" => flag(&mut create, "--image", value),
                "subnet-prefix" => flag(&mut create, "--subnet-address-prefix", value),
                "storage-type" => flag(&mut create, "--storage-sku", value),
                "disk-size" => flag(&mut create, "--os-disk-size-gb", value),
                "custom-data" => {
                    self.changed(
                        &at,
                        format!("a file: the scale set's custom data is read from it at creation ({value})"),
                    );
                    flag(&mut create, "--custom-data", value);
                }
                "no-public-ip" => self.changed(
                    &at,
                    "scale set instances get no public address unless --public-ip-per-vm is given; none is written",
                ),
                "use-private-ip" | "private-ip-address" => self.changed(
                    &at,
                    "Flotilla connects to the instance's private address whenever the plugin reports one; a fixed private address belongs to one machine",
                ),
                "static-public-ip" | "dns" => self.unmapped(
                    &at,
                    "a static public address or DNS label belongs to one machine; scale set instances get their own (add --public-ip-per-vm for public ones)",
                ),
                "availability-set" | "update-domain-count" | "fault-domain-count" => {
                    self.unmapped(
                        &at,
                        "a scale set spreads its instances over fault domains itself; it takes no availability set",
                    );
                }
                "accelerated-networking" => {
                    flag(&mut create, "--accelerated-networking", "true");
                }
                "nsg" => flag(&mut create, "--nsg", value),
                "managed-disks" => {}
                "client-id" | "client-secret" => self.unmapped(
                    &at,
                    "credentials are not copied: the pool's azure credential uses workload identity, a managed identity, or a client secret from the environment, with the role printed below",
                ),
                "environment" => self.unmapped(
                    &at,
                    "sovereign clouds: set the plugin's endpoint and the credential's authority_host by hand",
                ),
                "docker-port" | "open-port" => self.unmapped(
                    &at,
                    "Flotilla reaches Docker Engine over SSH, not a TCP port; open ports with the set's network security group",
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
            flag(&mut create, "--image", "<image-with-docker>");
        }
        if !opts.contains_key("azure-subscription-id") {
            self.changed(
                &with_option(options_at, "azure-subscription-id"),
                "unset: put the subscription id in subscription_id and in the commands",
            );
        }
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
        self.report.group = Some(GroupSpec {
            cloud: "azure".into(),
            commands,
            permissions: serde_json::to_string_pretty(&role).unwrap_or_default(),
        });
        let plugin = self.plugin_for("azure", options)?;
        let hosts = "[\"https://management.azure.com\"]";
        let sandbox = format!(
            "allowed_outbound_hosts = {hosts}\n\n[[pool.credentials]]\nname = \"azure\"\nkind = \"azure\"\nhosts = {hosts}\n"
        );
        let settings = format!(
            "\n[pool.plugin_config]\nsubscription_id = {}\nresource_group = {}\nname = {}\nmax_size = {}\ncredential = \"azure\"\nusername = {}\n",
            quote(&subscription),
            quote(&group),
            quote(&set),
            max.max(1),
            quote(&user)
        );
        Some((sandbox, settings, plugin))
    }
}
