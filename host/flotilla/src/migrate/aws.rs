//! `amazonec2` → an EC2 launch template and Auto Scaling group, managed by the aws plugin.

use flotilla_validate::KeyPath;

use super::{
    CloudPool, DriverOptions, GroupSpec, Runner, option, quote, shell_line, toml_strings,
    with_option,
};

/// An AWS region name: `eu-central-1`, `us-gov-west-1`, `ap-southeast-5`.
fn is_aws_region(name: &str) -> bool {
    let parts: Vec<&str> = name.split('-').collect();
    parts.len() >= 3
        && parts.len() <= 4
        && parts
            .last()
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        && parts
            .iter()
            .rev()
            .skip(1)
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_lowercase()))
}

/// A Docker Machine option that maps onto the launch template's data alone: the key it sets
/// and its value, or `None` for the options that need more than their own value.
fn template_entry(
    k: &str,
    value: &str,
    one: &dyn Fn(&str) -> Option<String>,
) -> Option<(&'static str, serde_json::Value)> {
    use serde_json::{Value, json};
    Some(match k {
        "ami" => ("ImageId", Value::from(value)),
        "instance-type" => ("InstanceType", Value::from(value)),
        "iam-instance-profile" => ("IamInstanceProfile", json!({ "Name": value })),
        "keypair-name" => ("KeyName", Value::from(value)),
        "monitoring" => ("Monitoring", json!({ "Enabled": true })),
        "use-ebs-optimized-instance" => ("EbsOptimized", Value::from(true)),
        "request-spot-instance" => (
            "InstanceMarketOptions",
            match one("spot-price") {
                Some(price) => {
                    json!({ "MarketType": "spot", "SpotOptions": { "MaxPrice": price } })
                }
                None => json!({ "MarketType": "spot" }),
            },
        ),
        "metadata-token" => (
            "MetadataOptions",
            match one("metadata-token-response-hop-limit").and_then(|h| h.parse::<u32>().ok()) {
                Some(hops) => json!({ "HttpTokens": value, "HttpPutResponseHopLimit": hops }),
                None => json!({ "HttpTokens": value }),
            },
        ),
        "tags" => {
            let parts: Vec<&str> = value.split(',').collect();
            let tags: Vec<Value> = parts
                .chunks(2)
                .map(|kv| {
                    json!({
                        "Key": kv.first().copied().unwrap_or_default(),
                        "Value": kv.get(1).copied().unwrap_or_default()
                    })
                })
                .collect();
            (
                "TagSpecifications",
                json!([{ "ResourceType": "instance", "Tags": tags }]),
            )
        }
        "root-size" | "volume-type" | "device-name" => {
            let size = one("root-size").and_then(|s| s.parse::<u32>().ok());
            let ebs = json!({
                "VolumeType": one("volume-type").unwrap_or_else(|| "gp2".into()),
                "VolumeSize": size.unwrap_or(16)
            });
            (
                "BlockDeviceMappings",
                json!([{
                    "DeviceName": one("device-name").unwrap_or_else(|| "/dev/sda1".into()),
                    "Ebs": ebs
                }]),
            )
        }
        _ => return None,
    })
}

/// The commands that create the launch template, the group (empty, at most `max`) and
/// suspend its rebalancing.
fn group_commands(
    region: &str,
    group: &str,
    template: &str,
    subnet: &str,
    max: u32,
) -> Vec<String> {
    let max = max.to_string();
    vec![
        shell_line(&[
            "aws",
            "ec2",
            "create-launch-template",
            "--region",
            region,
            "--launch-template-name",
            group,
            "--launch-template-data",
            template,
        ]),
        shell_line(&[
            "aws",
            "autoscaling",
            "create-auto-scaling-group",
            "--region",
            region,
            "--auto-scaling-group-name",
            group,
            "--launch-template",
            &format!("LaunchTemplateName={group},Version=$Latest"),
            "--min-size",
            "0",
            "--max-size",
            &max,
            "--desired-capacity",
            "0",
            "--vpc-zone-identifier",
            subnet,
            "--new-instances-protected-from-scale-in",
        ]),
        shell_line(&[
            "aws",
            "autoscaling",
            "suspend-processes",
            "--region",
            region,
            "--auto-scaling-group-name",
            group,
            "--scaling-processes",
            "AZRebalance",
        ]),
    ]
}

/// What the aws plugin's credential may do, as an IAM policy.
fn permissions() -> String {
    let permissions = serde_json::json!({
        "Version": "2012-10-17",
        "Statement": [{
            "Effect": "Allow",
            "Action": [
                "autoscaling:DescribeAutoScalingGroups",
                "autoscaling:SetDesiredCapacity",
                "autoscaling:TerminateInstanceInAutoScalingGroup",
                "ec2:DescribeInstances"
            ],
            "Resource": "*"
        }]
    });
    serde_json::to_string_pretty(&permissions).unwrap_or_default()
}

impl Runner<'_> {
    /// `amazonec2` options → a launch template and an Auto Scaling group, and the aws plugin.
    pub(super) fn aws(
        &mut self,
        opts: &DriverOptions,
        options_at: &KeyPath,
        pool: &str,
        max: u32,
    ) -> CloudPool {
        let one = |k: &str| option(opts, "amazonec2-", k);
        let region = self.aws_region(one("region"), options_at);
        let group = format!("flotilla-{pool}");
        let (data, notes) = self.launch_template(opts, options_at);
        let subnet = match (one("subnet-id"), one("vpc-id")) {
            (Some(s), _) => s,
            (None, vpc) => {
                let zone = one("zone").unwrap_or_else(|| "a".into());
                self.changed(
                    &with_option(options_at, "amazonec2-subnet-id"),
                    format!(
                        "unset: use the subnet of {} in {region}{zone}",
                        vpc.as_deref().unwrap_or("the default VPC")
                    ),
                );
                "<subnet-id>".to_string()
            }
        };
        let template = serde_json::Value::Object(data).to_string();
        let spec = GroupSpec {
            cloud: "aws".into(),
            commands: group_commands(&region, &group, &template, &subnet, max),
            permissions: permissions(),
        };
        let hosts = toml_strings(&[
            format!("https://autoscaling.{region}.amazonaws.com"),
            format!("https://ec2.{region}.amazonaws.com"),
        ]);
        let sandbox = format!(
            "allowed_outbound_hosts = {hosts}\n\n[[pool.credentials]]\nname = \"aws\"\nkind = \"aws\"\nhosts = {hosts}\n"
        );
        let mut settings = format!(
            "\n[pool.plugin_config]\nname = {}\nregion = {}\ncredential = \"aws\"\n",
            quote(&group),
            quote(&region)
        );
        for n in notes {
            settings.push_str(&n);
        }
        CloudPool {
            group: spec,
            sandbox,
            settings,
        }
    }

    /// `amazonec2-region`, or us-east-1 when it is unset or not a region's name.
    fn aws_region(&mut self, region: Option<String>, options_at: &KeyPath) -> String {
        match region {
            Some(r) if is_aws_region(&r) => r,
            Some(r) => {
                self.changed(
                    &with_option(options_at, "amazonec2-region"),
                    format!("{r:?} is not an AWS region like eu-central-1: written as us-east-1; put the real one in region, allowed_outbound_hosts and the commands"),
                );
                "us-east-1".to_string()
            }
            None => "us-east-1".to_string(),
        }
    }

    /// The launch template's data from the machine options, and the plugin settings some of
    /// them become; every other option is reported as changed or unmapped.
    fn launch_template(
        &mut self,
        opts: &DriverOptions,
        options_at: &KeyPath,
    ) -> (serde_json::Map<String, serde_json::Value>, Vec<String>) {
        let one = |k: &str| option(opts, "amazonec2-", k);
        let mut data = serde_json::Map::new();
        let mut notes = Vec::new();
        for (k, value, at) in self.driver_options(
            opts,
            "amazonec2-",
            "the AMI or the launch template's user data",
        ) {
            if let Some((key, entry)) = template_entry(k, value, &one) {
                data.insert(key.into(), entry);
                continue;
            }
            match k {
                "region" => {}
                "security-group" => {
                    let groups: Vec<&str> = opts
                        .get(&format!("amazonec2-{k}"))
                        .map(|v| v.iter().map(|(g, _)| g.as_str()).collect())
                        .unwrap_or_default();
                    if groups.iter().any(|g| !g.starts_with("sg-")) {
                        self.changed(
                            &at,
                            "security groups given by name: a launch template in a VPC takes ids, replace each name with its sg- id",
                        );
                    }
                    data.insert("SecurityGroupIds".into(), serde_json::Value::from(groups));
                }
                "userdata" => {
                    self.changed(
                        &at,
                        format!("a file: put its content, base64-encoded, in the launch template's UserData (from {value})"),
                    );
                    data.insert("UserData".into(), serde_json::Value::from(format!("<base64 of {value}>")));
                }
                "ssh-user" => notes.push(format!("username = {}\n", quote(value))),
                // Carried by [pool.connector] port.
                "ssh-port" => {}
                "access-key" | "secret-key" | "session-token" => self.unmapped(
                    &at,
                    "credentials are not copied: the pool signs with the AWS credential chain (instance role, IRSA, environment or shared files), with the policy printed below",
                ),
                "vpc-id" | "subnet-id" | "zone" | "spot-price" | "metadata-token-response-hop-limit" => {}
                "private-address-only" | "use-private-address" => self.changed(
                    &at,
                    "Flotilla connects to the instance's private address whenever the plugin reports one",
                ),
                _ => self.unmapped(&at, "no launch-template or group equivalent known to this migration; set it in the launch template by hand"),
            }
        }
        if !data.contains_key("ImageId") {
            self.changed(
                &with_option(options_at, "amazonec2-ami"),
                "unset: Docker Machine picked an Ubuntu AMI; set ImageId to an image with Docker Engine",
            );
            data.insert("ImageId".into(), serde_json::Value::from("<ami-id>"));
        }
        if !data.contains_key("InstanceType") {
            data.insert("InstanceType".into(), serde_json::Value::from("t2.micro"));
        }
        (data, notes)
    }
}
