//! `flotilla migrate docker-machine` as a user runs it: a GitLab Runner config with Docker
//! Machine runners in, a Flotilla config that `flotilla config check` accepts out, and a report
//! that names every key it could not carry over.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)] // test code: a failed assumption is a failed test

use std::path::Path;

use crate::common;

use common::cli as flotilla;
use flotilla_test_artifacts as guests;
use serde_json::Value;

const SECRET: &str = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY";

/// Two Docker Machine runners on AWS (one with autoscaling sections), one on GCP, and a shell
/// runner; keys that cannot be carried over on purpose.
fn runner_config() -> String {
    format!(
        r#"concurrent = 40
check_interval = 0

[[runners]]
  name = "AWS docker machine"
  url = "https://gitlab.example.com"
  token = "glrt-not-copied"
  executor = "docker+machine"
  limit = 20
  [runners.docker]
    image = "alpine:3.20"
  [runners.machine]
    IdleCount = 2
    IdleTime = 1800
    MaxBuilds = 10
    MaxGrowthRate = 6
    MachineDriver = "amazonec2"
    MachineName = "gitlab-docker-machine-%s"
    OffPeakPeriods = ["* * 0-9,18-23 * * mon-fri *"]
    MachineOptions = [
      "amazonec2-access-key=AKIAEXAMPLE",
      "amazonec2-secret-key={SECRET}",
      "amazonec2-region=eu-central-1",
      "amazonec2-vpc-id=vpc-23636848",
      "amazonec2-subnet-id=subnet-878ba5fa",
      "amazonec2-zone=b",
      "amazonec2-use-private-address=true",
      "amazonec2-tags=runner-manager-name,gitlab-aws-autoscaler,gitlab,true",
      "amazonec2-security-group=sg-0123456789",
      "amazonec2-instance-type=m5.large",
      "amazonec2-root-size=40",
      "amazonec2-ami=ami-0abcdef",
      "amazonec2-ssh-user=ubuntu",
      "engine-registry-mirror=https://mirror.example.com",
    ]
    [[runners.machine.autoscaling]]
      Periods = ["* * 9-17 * * mon-fri *"]
      IdleCount = 10
      IdleCountMin = 3
      IdleScaleFactor = 1.5
      IdleTime = 3600
      Timezone = "Europe/Berlin"
    [[runners.machine.autoscaling]]
      Periods = ["* * * * * sat,sun *"]
      IdleCount = 0
      Timezone = ""

[[runners]]
  name = "aws-unbounded"
  executor = "docker+machine"
  [runners.machine]
    IdleCount = 1
    MachineDriver = "amazonec2"
    MachineOptions = ["amazonec2-region=us-west-2", "amazonec2-ami=ami-1"]

[[runners]]
  name = "gcp"
  executor = "docker+machine"
  limit = 5
  [runners.machine]
    MachineDriver = "google"
    MachineOptions = ["google-project=ci-runners-4711", "google-zone=europe-west1-b"]

[[runners]]
  name = "shell"
  executor = "shell"
"#
    )
}

/// `flotilla migrate docker-machine --runner-config INPUT EXTRA...`.
fn migrate(input: &str, extra: &[&str]) -> (i32, String, String) {
    let mut args = vec!["migrate", "docker-machine", "--runner-config", input];
    args.extend_from_slice(extra);
    flotilla(&args)
}

fn dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("dir")
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write");
    p.display().to_string()
}

#[test]
fn docker_machine_runners_become_pools_that_pass_config_check() {
    let d = dir();
    let input = write(d.path(), "config.toml", &runner_config());
    let out = d.path().join("flotilla.toml").display().to_string();
    // The plugin given for AWS, relative to the current directory; GCP's is the built-in one.
    let cwd = std::env::current_dir().expect("cwd");
    let relative = pathdiff(Path::new(guests::AWS_PLUGIN), &cwd);
    let plugin = format!("aws={relative}");
    let token = token_file(d.path());
    let (code, stdout, stderr) = migrate(
        &input,
        &[
            "-o",
            &out,
            "--json",
            "--plugin",
            &plugin,
            "--token-file",
            &token,
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    let report: Value = serde_json::from_str(&stdout).expect("json");
    let runners = report["runners"].as_array().expect("runners");
    assert_eq!(runners.len(), 3, "{report:#}");
    assert_eq!(runners[0]["pool"], "aws-docker-machine", "{report:#}");
    assert_eq!(runners[1]["pool"], "aws-unbounded", "{report:#}");
    assert_eq!(runners[2]["pool"], "gcp", "{report:#}");
    assert_eq!(report["other_runners"], serde_json::json!(["shell"]));
    // Nothing dropped silently: each key that could not be carried over is named, with its line.
    let unmapped: Vec<String> = runners[0]["unmapped"]
        .as_array()
        .expect("unmapped")
        .iter()
        .map(|i| i["key"].as_str().unwrap_or_default().to_string())
        .collect();
    for key in [
        "MachineName",
        "OffPeakPeriods",
        "(amazonec2-access-key)",
        "(amazonec2-secret-key)",
        "(engine-registry-mirror)",
        "runners[0].docker",
    ] {
        assert!(
            unmapped.iter().any(|k| k.contains(key)),
            "{key} not reported: {unmapped:?}"
        );
    }
    assert!(
        runners[0]["unmapped"]
            .as_array()
            .expect("unmapped")
            .iter()
            .all(|i| i["line"].as_u64().is_some()),
        "{report:#}"
    );
    // The secret key is named, never copied.
    assert!(!stdout.contains(SECRET) && !stderr.contains(SECRET));
    let written = std::fs::read_to_string(&out).expect("written");
    assert!(!written.contains(SECRET) && !written.contains("glrt-"));
    // The paths are right from where the config is: absolute, whatever -o was.
    assert!(
        written.contains(&format!("plugin = \"{}\"", guests::AWS_PLUGIN)),
        "{written}"
    );
    assert!(written.contains("plugin = \"builtin:gcp\""), "{written}");
    // The server the runner blocks call, and the connector jobs run through.
    assert!(written.contains("listen = \"127.0.0.1:8080\""), "{written}");
    assert!(
        written.contains(&format!("token = {{ file = \"{token}\" }}")),
        "{written}"
    );
    assert!(
        written.contains("[pool.connector]\nusername = \"ubuntu\"\ndocker = true"),
        "{written}"
    );
    // The runner blocks: printed without the token, written with it for the operator only.
    let blocks = report["runners_toml"].as_str().expect("runners_toml");
    assert!(blocks.contains("executor = \"custom\""), "{blocks}");
    assert!(
        blocks.contains("\"--pool\",\"aws-docker-machine\""),
        "{blocks}"
    );
    assert!(
        blocks.contains("\"--default-image\",\"alpine:3.20\""),
        "{blocks}"
    );
    assert!(!blocks.contains("glrt-not-copied"), "{blocks}");
    let with_tokens = d.path().join("flotilla.runners.toml");
    let text = std::fs::read_to_string(&with_tokens).expect("runner blocks");
    assert!(text.contains("token = \"glrt-not-copied\""), "{text}");
    #[cfg(unix)]
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&with_tokens).expect("meta").permissions()
        ) & 0o777,
        0o600
    );
    let parsed: toml::Table = toml::from_str(&text).expect("the blocks are TOML");
    assert_eq!(parsed["runners"].as_array().map(Vec::len), Some(3));
    // The mapping, as a user would read it.
    for line in [
        "max_instances = 20",
        "max_use_count = 10",
        "scale_throttle = { limit = 0.1, burst = 6 }",
        "periods = [\"* 9-17 * * mon-fri\"]",
        "timezone = \"Europe/Berlin\"",
        "idle_count = 3",
        "scale_factor = 1.5",
        "scale_factor_limit = 10",
        "idle_time = \"3600s\"",
        "periods = [\"* * * * sat,sun\"]",
        "timezone = \"UTC\"",
        "idle_time = \"1800s\"",
        "region = \"eu-central-1\"",
        "username = \"ubuntu\"",
        "max_instances = 40",
    ] {
        assert!(written.contains(line), "{line:?} missing:\n{written}");
    }
    // The group to create once, with the plugin's permissions.
    let commands = runners[0]["group"]["commands"].to_string();
    assert!(commands.contains("--max-size 20"), "{commands}");
    assert!(commands.contains("subnet-878ba5fa"), "{commands}");
    assert!(
        commands.contains("m5.large") && commands.contains("ami-0abcdef"),
        "{commands}"
    );
    assert!(
        runners[0]["group"]["permissions"]
            .as_str()
            .is_some_and(|p| p.contains("autoscaling:SetDesiredCapacity")),
        "{report:#}"
    );
    // The output is a configuration Flotilla accepts.
    let (code, stdout, stderr) = flotilla(&["config", "check", "-c", &out]);
    assert_eq!(code, 0, "{stdout}{stderr}\n{written}");
    assert!(stdout.contains("OK (3 pools)"), "{stdout}");
    // An existing file is never replaced.
    let (code, _, stderr) = migrate(&input, &["-o", &out, "--plugin", &plugin]);
    assert_ne!(code, 0);
    assert!(stderr.contains("never replaced"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&out).expect("kept"), written);
}

/// A period that cron cannot express exactly refuses its runner, naming the period and line.
#[test]
fn a_period_that_cron_cannot_express_refuses_the_runner_with_the_period_named() {
    let d = dir();
    let input = write(
        d.path(),
        "config.toml",
        r#"[[runners]]
  name = "r"
  executor = "docker+machine"
  limit = 3
  [runners.machine]
    MachineDriver = "amazonec2"
    MachineOptions = ["amazonec2-ami=ami-1"]
    [[runners.machine.autoscaling]]
      Periods = ["* 9-17 * * mon-fri"]
      IdleCount = 1
"#,
    );
    let plugin = format!("aws={}", guests::AWS_PLUGIN);
    let (code, stdout, stderr) = migrate(&input, &["--plugin", &plugin]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("runners[0].machine.autoscaling[0].Periods[0] (line 9)")
            && stderr.contains("\"* 9-17 * * mon-fri\" has 5 fields"),
        "{stderr}"
    );
    assert!(!stdout.contains("[[pool]]"), "{stdout}");
    // A refused runner gets no pool, so nothing to create and no runner block either.
    assert!(!stderr.contains("create the aws group"), "{stderr}");
    assert!(!stderr.contains("[runners.custom]"), "{stderr}");
}

/// Input that is not TOML gets the file and line, and writes nothing.
#[test]
fn a_broken_runner_config_is_reported_with_its_line() {
    let d = dir();
    let input = write(
        d.path(),
        "config.toml",
        "[[runners]]\nname = \"x\nexecutor = 1\n",
    );
    let out = d.path().join("out.toml");
    let (code, _, stderr) = migrate(&input, &["-o", &out.display().to_string()]);
    assert_ne!(code, 0);
    assert!(
        stderr.contains("config.toml") && stderr.contains("line 2"),
        "{stderr}"
    );
    assert!(!out.exists());
}

/// A token file for the written `[server]`, readable by its owner only.
fn token_file(dir: &Path) -> String {
    let path = dir.join("token");
    std::fs::write(&path, "migrated-token-0123456789abcdef").expect("token");
    #[cfg(unix)]
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .expect("chmod");
    path.display().to_string()
}

/// `path` relative to `base` (both absolute), with `..` as needed.
fn pathdiff(path: &Path, base: &Path) -> String {
    let p: Vec<_> = path.components().collect();
    let b: Vec<_> = base.components().collect();
    let common = p.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let mut out = std::path::PathBuf::new();
    for _ in common..b.len() {
        out.push("..");
    }
    for c in &p[common..] {
        out.push(c);
    }
    out.display().to_string()
}

/// Migrates a fixture with `--plugin CLOUD=PLUGIN`: exit code, the JSON report, the written
/// configuration, and what `flotilla config check` said of it (its exit code and problems).
fn migrate_fixture(
    fixture: &str,
    cloud: &str,
    plugin: &str,
) -> (i32, Value, String, (i32, String)) {
    let d = dir();
    let input = format!("{}/tests/data/{fixture}", env!("CARGO_MANIFEST_DIR"));
    let out = d.path().join("flotilla.toml").display().to_string();
    let plugin = format!("{cloud}={plugin}");
    let token = token_file(d.path());
    let (code, stdout, stderr) = migrate(
        &input,
        &[
            "-o",
            &out,
            "--json",
            "--plugin",
            &plugin,
            "--token-file",
            &token,
        ],
    );
    let report: Value =
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}{stderr}"));
    let written = std::fs::read_to_string(&out).unwrap_or_default();
    let (check, check_out, check_err) = flotilla(&["config", "check", "-c", &out]);
    (
        code,
        report,
        written,
        (check, format!("{check_out}{check_err}")),
    )
}

/// The keys of one report list of the first runner.
fn keys(report: &Value, list: &str) -> Vec<String> {
    report["runners"][0][list]
        .as_array()
        .unwrap_or_else(|| panic!("{list}: {report:#}"))
        .iter()
        .map(|i| i["key"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// GitLab's own complete `config.toml` example (the `google` driver) becomes a gcp pool over a
/// managed instance group; the docs' placeholders and the keys that cannot map are named.
#[test]
fn the_gitlab_docs_google_example_becomes_a_gcp_pool() {
    let (code, report, written, (check, problems)) =
        migrate_fixture("gitlab-autoscale-google.toml", "gcp", guests::GCP_PLUGIN);
    assert_eq!(code, 0, "{report:#}");
    // The docs' placeholder project survives the migration (reported as changed), and the
    // plugin itself refuses it when the config is checked: one problem, located.
    assert_eq!(check, 1, "{problems}\n{written}");
    assert!(
        problems
            .contains("pool[0].plugin_config: the plugin refused it: project: \"<project-id>\"")
            && problems.contains("1 problem(s) found"),
        "{problems}"
    );
    for line in [
        "max_instances = 10",
        "max_use_count = 100",
        "kind = \"gcp\"",
        "allowed_outbound_hosts = [\"https://compute.googleapis.com\"]",
        "name = \"flotilla-autoscale-runner\"",
        "max_size = 10",
        "username = \"root\"",
        "periods = [\"* 9-17 * * mon-fri\"]",
        "scale_factor = 1.5",
        "idle_count = 5",
        "scale_factor_limit = 50",
        "periods = [\"* * * * sat,sun\"]",
        "idle_time = \"60s\"",
    ] {
        assert!(written.contains(line), "{line:?} missing:\n{written}");
    }
    for secret in ["RUNNER_TOKEN", "AMAZON_S3_SECRET_KEY"] {
        assert!(!written.contains(secret) && !report.to_string().contains(secret));
    }
    let commands = report["runners"][0]["group"]["commands"].to_string();
    for part in [
        "gcloud compute instance-templates create flotilla-autoscale-runner",
        "--image-family=ubuntu-1804-lts --image-project=ubuntu-os-cloud",
        "gcloud compute instance-groups managed create flotilla-autoscale-runner",
        "--size=0",
        "compute.instanceGroupManagers.update",
    ] {
        assert!(commands.contains(part), "{part:?} missing: {commands}");
    }
    let changed = keys(&report, "changed");
    for key in [
        "(google-project)",
        "(google-zone)",
        "(google-machine-type)",
        "(google-use-internal-ip)",
    ] {
        assert!(
            changed.iter().any(|k| k.contains(key)),
            "{key} not reported: {changed:?}"
        );
    }
    let unmapped = keys(&report, "unmapped");
    for key in [
        "MachineName",
        "(engine-registry-mirror)",
        "runners[0].docker",
        "runners[0].cache",
    ] {
        assert!(
            unmapped.iter().any(|k| k.contains(key)),
            "{key} not reported: {unmapped:?}"
        );
    }
}

/// A Docker Machine `azure` runner becomes an azure pool over a Uniform scale set with manual
/// scale; the client secret is named and never copied.
#[test]
fn an_azure_driver_runner_becomes_an_azure_pool() {
    let (code, report, written, (check, problems)) =
        migrate_fixture("docker-machine-azure.toml", "azure", guests::AZURE_PLUGIN);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(check, 0, "{problems}\n{written}");
    for line in [
        "max_instances = 8",
        "max_use_count = 20",
        "kind = \"azure\"",
        "subscription_id = \"d5a4fe64-1d3a-4f8e-9d7b-0a8f1c2e3b4c\"",
        "resource_group = \"ci-runners\"",
        "name = \"flotilla-azure-autoscale\"",
        "username = \"ubuntu\"",
        "timezone = \"Europe/Amsterdam\"",
        "periods = [\"* 8-18 * * mon-fri\"]",
    ] {
        assert!(written.contains(line), "{line:?} missing:\n{written}");
    }
    assert!(!written.contains("AzureClientSecretNotCopied"));
    assert!(!report.to_string().contains("AzureClientSecretNotCopied"));
    let commands = report["runners"][0]["group"]["commands"].to_string();
    for part in [
        "az vmss create --subscription d5a4fe64-1d3a-4f8e-9d7b-0a8f1c2e3b4c",
        "--orchestration-mode Uniform",
        "--disable-overprovision",
        "--upgrade-policy-mode Manual",
        "--vm-sku Standard_D2s_v3",
        "--image canonical:UbuntuServer:18.04-LTS:latest",
        "--instance-count 0",
        "az role definition create",
        "Microsoft.Compute/virtualMachineScaleSets/delete/action",
    ] {
        assert!(commands.contains(part), "{part:?} missing: {commands}");
    }
    let unmapped = keys(&report, "unmapped");
    for key in [
        "(azure-client-secret)",
        "(azure-client-id)",
        "(azure-availability-set)",
        "(azure-open-port)",
        "(engine-registry-mirror)",
        "MachineName",
    ] {
        assert!(
            unmapped.iter().any(|k| k.contains(key)),
            "{key} not reported: {unmapped:?}"
        );
    }
    assert!(
        keys(&report, "changed")
            .iter()
            .any(|k| k.contains("(azure-use-private-ip)"))
    );
}

/// A runner config written to hurt: secrets under names a deny-list misses (`AccountKey`,
/// `PrivateKey`, an `environment` entry, a URL's user information), a region that tries to
/// write TOML, and driver options that try to run shell code when the printed commands are
/// pasted. No secret is printed, the written config is checked OK, and each printed command
/// is, to a real shell, exactly the arguments meant.
#[test]
fn a_hostile_runner_config_prints_no_secret_and_commands_that_run_nothing_injected() {
    let d = dir();
    let input = write(
        d.path(),
        "config.toml",
        r##"[[runners]]
  name = "hostile"
  url = "https://ci-bot:URLSECRET@gitlab.example.com"
  token = "glrt-TOKENSECRET"
  executor = "docker+machine"
  limit = 2
  environment = ["X_SECRET=ENVSECRET", "PLAIN=ENVPLAIN"]
  [runners.cache]
    Type = "azure"
    [runners.cache.azure]
      AccountName = "acct"
      AccountKey = "AZKEYSECRET"
      ContainerName = "cache"
    [runners.cache.gcs]
      AccessID = "bot@p.iam.gserviceaccount.com"
      PrivateKey = "-----BEGIN PRIVATE KEY-----GCSKEYSECRET"
      BucketName = "bucket"
  [runners.machine]
    IdleCount = 0
    MachineDriver = "amazonec2"
    MachineOptions = [
      "amazonec2-region=eu-west-1\"\nmalicious = true\n#",
      "amazonec2-subnet-id=subnet-1'; touch PWNED; echo '",
      "amazonec2-ami=ami-$(touch PWNED2)`touch PWNED3`",
    ]
"##,
    );
    let out = d.path().join("flotilla.toml").display().to_string();
    let plugin = format!("aws={}", guests::AWS_PLUGIN);
    let token = token_file(d.path());
    let args = ["-o", &out, "--plugin", &plugin, "--token-file", &token];
    let (code, text_out, text_err) = migrate(&input, &args);
    assert_eq!(code, 0, "{text_err}");
    std::fs::remove_file(&out).expect("written");
    std::fs::remove_file(d.path().join("flotilla.runners.toml")).expect("blocks");
    let mut json_args = args.to_vec();
    json_args.push("--json");
    let (code, stdout, stderr) = migrate(&input, &json_args);
    assert_eq!(code, 0, "{stderr}");
    let printed = format!("{text_out}{text_err}{stdout}{stderr}");
    for secret in [
        "URLSECRET",
        "TOKENSECRET",
        "ENVSECRET",
        "AZKEYSECRET",
        "GCSKEYSECRET",
    ] {
        assert!(!printed.contains(secret), "{secret} printed:\n{printed}");
    }
    // What is not secret still reads as it was.
    let report: Value = serde_json::from_str(&stdout).expect("json");
    let blocks = report["runners_toml"].as_str().expect("runners_toml");
    for kept in [
        "AccountName = \"acct\"",
        "BucketName = \"bucket\"",
        "X_SECRET=<",
    ] {
        assert!(blocks.contains(kept), "{kept}:\n{blocks}");
    }
    // The region could not write TOML: it was refused, and the config checks OK.
    let written = std::fs::read_to_string(&out).expect("written");
    assert!(!written.contains("malicious"), "{written}");
    assert!(written.contains("region = \"us-east-1\""), "{written}");
    let changed = report["runners"][0]["changed"].to_string();
    assert!(changed.contains("is not an AWS region"), "{changed}");
    let (check, check_out, check_err) = flotilla(&["config", "check", "-c", &out]);
    assert_eq!(check, 0, "{check_out}{check_err}\n{written}");
    // Each command, run by sh with the cloud CLIs replaced by argument printers, is the
    // arguments meant and runs nothing else.
    let commands = report["runners"][0]["group"]["commands"]
        .as_array()
        .expect("commands");
    let shell = tempfile::tempdir().expect("dir");
    let mut argvs = Vec::new();
    for command in commands {
        let command = command.as_str().expect("a command");
        let ran = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(format!("aws() {{ printf '%s\\0' aws \"$@\"; }}\n{command}"))
            .current_dir(shell.path())
            .output()
            .expect("sh");
        assert!(ran.status.success(), "{command}: {ran:?}");
        let argv: Vec<String> = String::from_utf8_lossy(&ran.stdout)
            .split_terminator('\0')
            .map(str::to_string)
            .collect();
        argvs.push(argv);
    }
    let leftovers: Vec<_> = std::fs::read_dir(shell.path())
        .expect("dir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert!(leftovers.is_empty(), "the commands ran {leftovers:?}");
    let after = |argv: &[String], flag: &str| {
        argv.iter()
            .position(|a| a == flag)
            .and_then(|i| argv.get(i + 1))
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(argvs.len(), 3, "{argvs:?}");
    assert_eq!(
        after(&argvs[1], "--vpc-zone-identifier"),
        "subnet-1'; touch PWNED; echo '"
    );
    let template: Value =
        serde_json::from_str(&after(&argvs[0], "--launch-template-data")).expect("JSON");
    assert_eq!(template["ImageId"], "ami-$(touch PWNED2)`touch PWNED3`");
    for argv in &argvs {
        assert_eq!(after(argv, "--region"), "us-east-1", "{argv:?}");
    }
}
