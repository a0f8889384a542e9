//! One virtual machine scale set in ARM's terms, in both orchestration modes: reading it,
//! listing its VMs with their states, changing its capacity, deleting named instances and
//! finding an instance's addresses.
//!
//! Instance ids are what Delete Instances takes: the decimal `instanceId` of a Uniform set's
//! VM, the VM name of a Flexible set's.
//! <https://learn.microsoft.com/en-us/azure/virtual-machine-scale-sets/virtual-machine-scale-sets-instance-ids>
//!
//! Must not know: the contract's rules (what to grant, what counts as accepted); `lib.rs` does.

use std::time::Duration;

use flotilla_guest_http::Method;
use serde_json::{Value, json};

use crate::arm::{Arm, Outcome, cap};
use crate::flotilla::provider::types::{Error, InstanceState};

/// Microsoft.Compute: scale sets, their VMs, and VMs.
pub const COMPUTE_API: &str = "2024-07-01";
/// Microsoft.Network: network interfaces and public IP addresses of Flexible sets' VMs.
pub const NETWORK_API: &str = "2024-05-01";
/// The network interfaces and public IPs of a Uniform set's VMs are served by the scale set
/// and answer only this older Microsoft.Network version.
/// <https://learn.microsoft.com/en-us/rest/api/virtualnetwork/network-interface-in-vm-ss/list-virtual-machine-scale-set-vm-network-interfaces>
pub const VMSS_NETWORK_API: &str = "2018-10-01";

/// How the set manages its VMs (fixed when the set is created).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// VMs are the set's own sub-resources (`virtualMachineScaleSets/{set}/virtualMachines`).
    Uniform,
    /// VMs are ordinary `Microsoft.Compute/virtualMachines` that name the set.
    Flexible,
}

/// The scale set as Get reports it.
/// <https://learn.microsoft.com/en-us/rest/api/compute/virtual-machine-scale-sets/get>
pub struct SetInfo {
    pub capacity: u32,
    pub mode: Mode,
    /// Uniform only: the set starts extra VMs and deletes them again.
    pub overprovision: bool,
    /// The model's OS disk says Windows.
    pub windows: bool,
}

/// One VM of the set.
pub struct Vm {
    pub id: String,
    pub state: InstanceState,
}

impl Vm {
    /// Holds capacity: neither deleting nor gone.
    pub fn live(&self) -> bool {
        !matches!(self.state, InstanceState::Deleting | InstanceState::Deleted)
    }
}

/// Where an instance can be reached.
pub struct Addresses {
    pub private: Option<String>,
    pub public: Option<String>,
    pub windows: bool,
    /// `westeurope-2`: the region and the zone number, as Kubernetes' zone label names an
    /// Azure zone; `None` for a VM placed in no zone.
    pub zone: Option<String>,
}

/// The zone of a VM resource (a Virtual Machine, or a scale set's VM): its `location` with the
/// first entry of its `zones` array, which Azure gives as a bare number (`"2"`).
fn zone_of(vm: &Value) -> Option<String> {
    let zone = array(vm, &["zones"]).first().and_then(Value::as_str)?;
    let location = text(vm, &["location"])?;
    (!zone.is_empty() && !location.is_empty()).then(|| format!("{location}-{zone}"))
}

/// The managed scale set.
pub struct ScaleSet {
    pub arm: Arm,
    /// `/subscriptions/{sub}/resourceGroups/{group}`.
    pub group_path: String,
    /// The set's resource id, `{group_path}/providers/Microsoft.Compute/virtualMachineScaleSets/{name}`.
    pub id: String,
    pub mode: Mode,
    pub windows: bool,
}

const READ_SET: &str = "Microsoft.Compute/virtualMachineScaleSets/read";
const WRITE_SET: &str = "Microsoft.Compute/virtualMachineScaleSets/write";
const DELETE_INSTANCES: &str = "Microsoft.Compute/virtualMachineScaleSets/delete/action";
const READ_SET_VMS: &str = "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read";
const READ_SET_VM_NICS: &str =
    "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/networkInterfaces/read";
const READ_SET_VM_PUBLIC_IPS: &str = "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/networkInterfaces/ipConfigurations/publicIPAddresses/read";
const READ_VMS: &str = "Microsoft.Compute/virtualMachines/read";
const READ_NICS: &str = "Microsoft.Network/networkInterfaces/read";
const READ_PUBLIC_IPS: &str = "Microsoft.Network/publicIPAddresses/read";

fn text<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter()
        .try_fold(v, |v, k| v.get(k))
        .and_then(Value::as_str)
}

fn array<'a>(v: &'a Value, path: &[&str]) -> &'a [Value] {
    path.iter()
        .try_fold(v, |v, k| v.get(k))
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// The entry marked `properties.primary`, else the first.
fn primary(items: &[Value]) -> Option<&Value> {
    items
        .iter()
        .find(|i| i.pointer("/properties/primary") == Some(&Value::Bool(true)))
        .or_else(|| items.first())
}

/// An id usable in a URL path segment: what Azure allows in VM names and instance ids.
pub fn plausible_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 80
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Reads the set.
pub fn get_set(arm: &Arm, id: &str) -> Result<SetInfo, Error> {
    let set = arm.get(READ_SET, &arm.url(id, COMPUTE_API, &[]))?;
    let capacity = set
        .pointer("/sku/capacity")
        .and_then(Value::as_u64)
        .map_or(0, |c| u32::try_from(c).unwrap_or(u32::MAX));
    // Sets created before Flexible existed report no mode: they are Uniform.
    let mode = match text(&set, &["properties", "orchestrationMode"]) {
        Some(m) if m.eq_ignore_ascii_case("Flexible") => Mode::Flexible,
        _ => Mode::Uniform,
    };
    let os = text(
        &set,
        &[
            "properties",
            "virtualMachineProfile",
            "storageProfile",
            "osDisk",
            "osType",
        ],
    );
    Ok(SetInfo {
        capacity,
        mode,
        overprovision: set.pointer("/properties/overprovision") != Some(&Value::Bool(false)),
        windows: os.is_some_and(|o| o.eq_ignore_ascii_case("Windows")),
    })
}

/// A VM's state from its provisioning state and the power state of its instance view.
/// <https://learn.microsoft.com/en-us/azure/virtual-machines/states-billing>
pub fn state(vm: &Value) -> InstanceState {
    let statuses = array(vm, &["properties", "instanceView", "statuses"]);
    let code = |prefix: &str| {
        statuses
            .iter()
            .filter_map(|s| s.get("code").and_then(Value::as_str))
            .find_map(|c| c.strip_prefix(prefix))
            .map(str::to_ascii_lowercase)
    };
    let provisioning = text(vm, &["properties", "provisioningState"])
        .map(str::to_ascii_lowercase)
        .or_else(|| code("ProvisioningState/"));
    match provisioning.as_deref() {
        Some("deleting") => return InstanceState::Deleting,
        Some("creating") => return InstanceState::Creating,
        Some(p) if p.starts_with("failed") => {
            let why = code("ProvisioningState/").unwrap_or_else(|| "failed".into());
            return InstanceState::Failed(cap(format!("provisioning state {why}")));
        }
        _ => {}
    }
    let spot =
        text(vm, &["properties", "priority"]).is_some_and(|p| p.eq_ignore_ascii_case("Spot"));
    match code("PowerState/").as_deref() {
        Some("running") => InstanceState::Running,
        None | Some("starting") => InstanceState::Creating,
        // A Spot VM stopped by Azure is an eviction: capacity or price took it back.
        // <https://learn.microsoft.com/en-us/azure/virtual-machines/spot-vms#eviction-policy>
        Some(other @ ("deallocating" | "deallocated" | "stopping" | "stopped")) if spot => {
            InstanceState::Failed(cap(format!(
                "Azure reclaimed this Spot VM (evicted; power state {other})"
            )))
        }
        Some(other) => InstanceState::Failed(cap(format!("power state {other}"))),
    }
}

impl ScaleSet {
    /// Every VM of the set with its state, all pages.
    pub fn instances(&self) -> Result<Vec<Vm>, Error> {
        match self.mode {
            // <https://learn.microsoft.com/en-us/rest/api/compute/virtual-machine-scale-set-vms/list>
            Mode::Uniform => {
                let url = self.arm.url(
                    &format!("{}/virtualMachines", self.id),
                    COMPUTE_API,
                    &[("$expand", "instanceView")],
                );
                let vms = self.arm.list(READ_SET_VMS, &url)?;
                Ok(vms
                    .iter()
                    .filter_map(|vm| {
                        let id = vm.get("instanceId").and_then(Value::as_str)?;
                        Some(Vm {
                            id: id.to_string(),
                            state: state(vm),
                        })
                    })
                    .collect())
            }
            // <https://learn.microsoft.com/en-us/rest/api/compute/virtual-machines/list>
            Mode::Flexible => {
                // The property is quoted, as the spec's examples and every caller write it
                // (azure-cli #24609, the Compute .NET tests, CAPZ); the unquoted form is
                // refused with BadRequest on 2024-07-01.
                let filter = format!("'virtualMachineScaleSet/id' eq '{}'", self.id);
                let url = self.arm.url(
                    &format!(
                        "{}/providers/Microsoft.Compute/virtualMachines",
                        self.group_path
                    ),
                    COMPUTE_API,
                    &[("$filter", &filter), ("$expand", "instanceView")],
                );
                let vms = self.arm.list(READ_VMS, &url)?;
                Ok(vms
                    .iter()
                    .filter(|vm| self.owns(vm))
                    .filter_map(|vm| {
                        let name = vm.get("name").and_then(Value::as_str)?;
                        Some(Vm {
                            id: name.to_string(),
                            state: state(vm),
                        })
                    })
                    .collect())
            }
        }
    }

    /// A Flexible VM names this set (the filter already says so; this keeps a VM of another
    /// set out even if a filter were ignored).
    fn owns(&self, vm: &Value) -> bool {
        text(vm, &["properties", "virtualMachineScaleSet", "id"])
            .is_some_and(|id| id.eq_ignore_ascii_case(&self.id))
    }

    /// Sets the capacity (Update with `sku.capacity`) and follows the operation for `budget`.
    /// <https://learn.microsoft.com/en-us/rest/api/compute/virtual-machine-scale-sets/update>
    pub fn set_capacity(&self, capacity: u32, budget: Duration) -> Result<Outcome, Error> {
        let url = self.arm.url(&self.id, COMPUTE_API, &[]);
        let body = json!({ "sku": { "capacity": capacity } });
        self.arm
            .change(WRITE_SET, Method::Patch, &url, &body, budget)
    }

    /// Deletes the named instances; the capacity drops with them.
    /// <https://learn.microsoft.com/en-us/rest/api/compute/virtual-machine-scale-sets/delete-instances>
    pub fn delete(&self, ids: &[String], budget: Duration) -> Result<Outcome, Error> {
        let url = self
            .arm
            .url(&format!("{}/delete", self.id), COMPUTE_API, &[]);
        let body = json!({ "instanceIds": ids });
        self.arm
            .change(DELETE_INSTANCES, Method::Post, &url, &body, budget)
    }

    /// The private and public address of one instance; not-found when it is not the set's.
    pub fn addresses(&self, id: &str) -> Result<Addresses, Error> {
        let gone = || Error::NotFound(format!("instance {id:?} is not in scale set {}", self.id));
        let plausible = plausible_id(id)
            && (self.mode == Mode::Flexible || id.chars().all(|c| c.is_ascii_digit()));
        if !plausible {
            return Err(gone());
        }
        let (nics, windows, zone) = match self.mode {
            Mode::Uniform => self.uniform_vm(id, gone)?,
            Mode::Flexible => self.flexible_vm(id, gone)?,
        };
        let config = primary(&nics)
            .map(|nic| array(nic, &["properties", "ipConfigurations"]))
            .and_then(primary);
        let private = config
            .and_then(|c| text(c, &["properties", "privateIPAddress"]))
            .map(str::to_string);
        let public = match config.and_then(|c| text(c, &["properties", "publicIPAddress", "id"])) {
            Some(ip) => self.public_ip(ip)?,
            None => None,
        };
        Ok(Addresses {
            private,
            public,
            windows,
            zone,
        })
    }

    /// A Uniform set's VM: its network interfaces, whether it runs Windows (the set's
    /// setting), and its zone.
    /// <https://learn.microsoft.com/en-us/rest/api/compute/virtual-machine-scale-set-vms/get>
    /// <https://learn.microsoft.com/en-us/rest/api/virtualnetwork/network-interface-in-vm-ss/list-virtual-machine-scale-set-vm-network-interfaces>
    fn uniform_vm(
        &self,
        id: &str,
        gone: impl Fn() -> Error + Copy,
    ) -> Result<(Vec<Value>, bool, Option<String>), Error> {
        let vm_url = self.arm.url(
            &format!("{}/virtualMachines/{id}", self.id),
            COMPUTE_API,
            &[],
        );
        let vm = self
            .arm
            .get(READ_SET_VMS, &vm_url)
            .map_err(|e| not_found_as(e, gone))?;
        let url = self.arm.url(
            &format!("{}/virtualMachines/{id}/networkInterfaces", self.id),
            VMSS_NETWORK_API,
            &[],
        );
        let nics = self
            .arm
            .list(READ_SET_VM_NICS, &url)
            .map_err(|e| not_found_as(e, gone))?;
        Ok((nics, self.windows, zone_of(&vm)))
    }

    /// A Flexible set's VM: its primary network interface, whether it runs Windows (its OS
    /// disk's `osType`), and its zone; not-found when the VM is not the set's.
    /// <https://learn.microsoft.com/en-us/rest/api/compute/virtual-machines/get>
    /// <https://learn.microsoft.com/en-us/rest/api/virtualnetwork/network-interfaces/get>
    fn flexible_vm(
        &self,
        id: &str,
        gone: impl Fn() -> Error + Copy,
    ) -> Result<(Vec<Value>, bool, Option<String>), Error> {
        let url = self.arm.url(
            &format!(
                "{}/providers/Microsoft.Compute/virtualMachines/{id}",
                self.group_path
            ),
            COMPUTE_API,
            &[],
        );
        let vm = self
            .arm
            .get(READ_VMS, &url)
            .map_err(|e| not_found_as(e, gone))?;
        if !self.owns(&vm) {
            return Err(gone());
        }
        let os = text(&vm, &["properties", "storageProfile", "osDisk", "osType"]);
        let windows = os.map_or(self.windows, |o| o.eq_ignore_ascii_case("Windows"));
        let refs = array(&vm, &["properties", "networkProfile", "networkInterfaces"]);
        let nic_id = primary(refs)
            .and_then(|n| n.get("id"))
            .and_then(Value::as_str);
        let nics = match nic_id {
            Some(nic) => vec![
                self.arm
                    .get(READ_NICS, &self.arm.url(nic, NETWORK_API, &[]))?,
            ],
            None => Vec::new(),
        };
        Ok((nics, windows, zone_of(&vm)))
    }

    /// The address of a public IP resource, by its id (a Uniform set's VM's public IPs live
    /// under the set and need the older API version).
    /// <https://learn.microsoft.com/en-us/rest/api/virtualnetwork/public-ip-addresses/get>
    fn public_ip(&self, ip: &str) -> Result<Option<String>, Error> {
        let under_set = ip
            .to_ascii_lowercase()
            .contains("/microsoft.compute/virtualmachinescalesets/");
        let (api, action) = if under_set {
            (VMSS_NETWORK_API, READ_SET_VM_PUBLIC_IPS)
        } else {
            (NETWORK_API, READ_PUBLIC_IPS)
        };
        let address = self.arm.get(action, &self.arm.url(ip, api, &[]))?;
        Ok(text(&address, &["properties", "ipAddress"]).map(str::to_string))
    }
}

/// A 404 of a lookup by id becomes the caller's own not-found message.
fn not_found_as(e: Error, gone: impl FnOnce() -> Error) -> Error {
    match e {
        Error::NotFound(_) => gone(),
        other => other,
    }
}
