//! `amazonec2` → an EC2 launch template and Auto Scaling group, managed by the aws plugin.

use flotilla_validate::KeyPath;

use super::{
    DriverOptions, GroupSpec, Options, Runner, option, quote, shell_line, toml_strings, with_option,
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

impl Runner<'_> {
    /// `amazonec2` options → a launch template and an Auto Scaling group, and the aws plugin.
    pub(super) fn aws(
        &mut self,
        opts: &DriverOptions,
        options_at: &KeyPath,
        pool: &str,
        max: u32,
        options: &Options,
    ) -> Option<(String, String, String)> {
        let one = |k: &str| option(opts, "amazonec2-", k);
        let region = match one("region") {
            Some(r) if is_aws_region(&r) => r,
            Some(r) => {
                self.changed(
                    &with_option(options_at, "amazonec2-region"),
                    format!("{r:?} is not an AWS region like eu-central-1: written as us-east-1; put the real one in region, allowed_outbound_hosts and the commands"),
                );
                "us-east-1".to_string()
            }
            None => "us-east-1".to_string(),
        };
        let group = format!("flotilla-{pool}");
        let mut data = serde_json::Map::new();
        let mut notes = Vec::new();
        for (k, value, at) in self.driver_options(
            opts,
            "amazonec2-",
            "the AMI or the launch template's user data",
        ) {
            match k {
                "region" => {}
                "ami" => {
                    data.insert("ImageId".into(), serde_json::Value::from(value.as_str()));
                }
                "instance-type" => {
                    data.insert("InstanceType".into(), serde_json::Value::from(value.as_str()));
                }
                "iam-instance-profile" => {
                    data.insert(
                        "IamInstanceProfile".into(),
                        serde_json::json!({ "Name": value }),
                    );
                }
                "keypair-name" => {
                    data.insert("KeyName".into(), serde_json::Value::from(value.as_str()));
                }
                "monitoring" => {
                    data.insert("Monitoring".into(), serde_json::json!({ "Enabled": true }));
                }
                "use-ebs-optimized-instance" => {
                    data.insert("EbsOptimized".into(), serde_json::Value::from(true));
                }
                "request-spot-instance" => {
                    let spot = match one("spot-price") {
                        Some(price) => serde_json::json!({
                            "MarketType": "spot",
                            "SpotOptions": { "MaxPrice": price }
                        }),
                        None => serde_json::json!({ "MarketType": "spot" }),
                    };
                    data.insert("InstanceMarketOptions".into(), spot);
                }
                "metadata-token" => {
                    let hops = one("metadata-token-response-hop-limit")
                        .and_then(|h| h.parse::<u32>().ok());
                    let m = match hops {
                        Some(hops) => serde_json::json!({
                            "HttpTokens": value,
                            "HttpPutResponseHopLimit": hops
                        }),
                        None => serde_json::json!({ "HttpTokens": value }),
                    };
                    data.insert("MetadataOptions".into(), m);
                }
                "tags" => {
                    let parts: Vec<&str> = value.split(',').collect();
                    let tags: Vec<serde_json::Value> = parts
                        .chunks(2)
                        .map(|kv| {
                            serde_json::json!({
                                "Key": kv.first().copied().unwrap_or_default(),
                                "Value": kv.get(1).copied().unwrap_or_default()
                            })
                        })
                        .collect();
                    data.insert(
                        "TagSpecifications".into(),
                        serde_json::json!([{ "ResourceType": "instance", "Tags": tags }]),
                    );
                }
                "root-size" | "volume-type" | "device-name" => {
                    let size = one("root-size").and_then(|s| s.parse::<u32>().ok());
                    let ebs = serde_json::json!({
                        "VolumeType": one("volume-type").unwrap_or_else(|| "gp2".into()),
                        "VolumeSize": size.unwrap_or(16)
                    });
                    data.insert(
                        "BlockDeviceMappings".into(),
                        serde_json::json!([{
                            "DeviceName": one("device-name").unwrap_or_else(|| "/dev/sda1".into()),
                            "Ebs": ebs
                        }]),
                    );
                }
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
        let max = max.to_string();
        let commands = vec![
            shell_line(&[
                "aws",
                "ec2",
                "create-launch-template",
                "--region",
                &region,
                "--launch-template-name",
                &group,
                "--launch-template-data",
                &template,
            ]),
            shell_line(&[
                "aws",
                "autoscaling",
                "create-auto-scaling-group",
                "--region",
                &region,
                "--auto-scaling-group-name",
                &group,
                "--launch-template",
                &format!("LaunchTemplateName={group},Version=$Latest"),
                "--min-size",
                "0",
                "--max-size",
                &max,
                "--desired-capacity",
                "0",
                "--vpc-zone-identifier",
                &subnet,
                "--new-instances-protected-from-scale-in",
            ]),
            shell_line(&[
                "aws",
                "autoscaling",
                "suspend-processes",
                "--region",
                &region,
                "--auto-scaling-group-name",
                &group,
                "--scaling-processes",
                "AZRebalance",
            ]),
        ];
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
        self.report.group = Some(GroupSpec {
            cloud: "aws".into(),
            commands,
            permissions: serde_json::to_string_pretty(&permissions).unwrap_or_default(),
        });
        let plugin = self.plugin_for("aws", options)?;
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
        Some((sandbox, settings, plugin))
    }
}
