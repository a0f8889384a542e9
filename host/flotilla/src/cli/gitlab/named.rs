//! The driver's settings that are spelled by name on the command line (`--os`, `--shell`,
//! `--pull-policy`): clap knows their names (`--help` lists them, an unknown one is refused
//! with the list, shell completion offers them), and the setting's own parser reads the
//! value, so the command line accepts exactly what the job settings and `connect-info`
//! accept (`darwin` for `macos`, any case for a system).

use clap::builder::{PossibleValue, TypedValueParser};
use clap::error::{ContextKind, ContextValue, ErrorKind};
use flotilla_gitlab::SettingError;

/// A setting's names and its parser.
#[derive(Clone, Copy)]
pub(super) struct Named<T: 'static> {
    names: &'static [&'static str],
    parse: fn(&str) -> Result<T, SettingError>,
}

impl<T> Named<T> {
    /// The setting read by `parse`, whose values are `names`.
    pub(super) const fn new(
        names: &'static [&'static str],
        parse: fn(&str) -> Result<T, SettingError>,
    ) -> Self {
        Named { names, parse }
    }
}

impl<T: Clone + Send + Sync + 'static> TypedValueParser for Named<T> {
    type Value = T;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<T, clap::Error> {
        let text = value.to_string_lossy();
        (self.parse)(&text).map_err(|_| {
            let mut e = clap::Error::new(ErrorKind::InvalidValue).with_cmd(cmd);
            if let Some(arg) = arg {
                e.insert(
                    ContextKind::InvalidArg,
                    ContextValue::String(arg.to_string()),
                );
            }
            e.insert(
                ContextKind::InvalidValue,
                ContextValue::String(text.into_owned()),
            );
            let names = self.names.iter().map(|n| (*n).to_string()).collect();
            e.insert(ContextKind::ValidValue, ContextValue::Strings(names));
            e
        })
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        Some(Box::new(self.names.iter().map(|n| PossibleValue::new(*n))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_gitlab::{MachineOs, PullPolicy};

    #[derive(clap::Parser, Debug)]
    struct Cli {
        #[arg(long, default_value = "linux", value_parser = Named::new(MachineOs::NAMES, MachineOs::parse))]
        os: MachineOs,
        #[arg(long, default_value = "always", value_parser = Named::new(PullPolicy::NAMES, PullPolicy::parse))]
        pull_policy: PullPolicy,
    }

    #[test]
    fn every_name_reads_back_as_itself() {
        use flotilla_gitlab::Shell;
        for name in MachineOs::NAMES {
            assert_eq!(MachineOs::parse(name).map(MachineOs::name), Ok(*name));
        }
        for name in Shell::NAMES {
            assert_eq!(Shell::parse(name).map(Shell::name), Ok(*name));
        }
        for name in PullPolicy::NAMES {
            assert_eq!(PullPolicy::parse(name).map(PullPolicy::name), Ok(*name));
        }
    }

    #[test]
    fn a_named_setting_lists_its_names_and_keeps_its_own_spellings() {
        use clap::{CommandFactory, Parser};
        let cli = Cli::try_parse_from(["x", "--os", "Darwin", "--pull-policy", "never"])
            .expect("darwin is macos, in any case");
        assert_eq!(
            (cli.os, cli.pull_policy),
            (MachineOs::Macos, PullPolicy::Never)
        );
        let e = Cli::try_parse_from(["x", "--os", "plan9"]).expect_err("not a system");
        assert_eq!(e.kind(), ErrorKind::InvalidValue);
        let said = e.to_string();
        assert!(said.contains("'plan9'"), "{said}");
        assert!(said.contains("--os <OS>"), "{said}");
        assert!(said.contains("linux, macos, freebsd, windows"), "{said}");
        let help = Cli::command().render_long_help().to_string();
        assert!(help.contains("if-not-present"), "{help}");
    }
}
