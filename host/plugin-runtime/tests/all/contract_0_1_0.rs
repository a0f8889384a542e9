//! A plugin built against the frozen 0.1.0 contract loads and runs unchanged on this 0.1.4 host.
use super::*;

#[tokio::test]
async fn a_plugin_built_against_0_1_0_loads_and_runs_unchanged() {
    let plugin = load(guests::CONTRACT_0_1_0);
    let names: Vec<&str> = plugin
        .shape
        .imports
        .iter()
        .map(|i| i.name.as_str())
        .collect();
    assert!(names.contains(&"flotilla:provider/log@0.1.0"), "{names:?}");
    assert!(
        !names.iter().any(|n| n.contains("instance-access")),
        "{names:?}"
    );
    assert_eq!(
        plugin.shape.instance_group,
        "flotilla:provider/instance-group@0.1.0"
    );
    let logs = LogCapture::default();
    let p = {
        let _guard = logs.install();
        let p = plugin.provider("legacy", Sandbox::default());
        let info = must(p.init("{}")).await;
        assert_eq!(info.id, "legacy/0.1.0");
        p
    };
    assert!(
        logs.text().contains("built against 0.1.0"),
        "{}",
        logs.text()
    );
    let instances = must(p.update()).await.instances;
    assert_eq!(instances.len(), 1);
    assert_eq!(instances[0].state, InstanceState::Running);
    // Its `connection` is the older record (no zone): it is called through the 0.1.3
    // bindings and lifted.
    let c = must(p.connect_info("legacy-1")).await;
    assert_eq!(c.protocol, Protocol::Ssh);
    assert_eq!(c.zone, None);
}
