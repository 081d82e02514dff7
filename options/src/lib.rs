//! Option files for clap command lines: `PROGRAM SUBCOMMAND --config FILE` reads a TOML file
//! whose keys are that subcommand's long flags (`micro-batch = 256`, `worker = ["http://..."]`,
//! `consolidate = false`) and applies them with the precedence
//! **defaults < file < environment < flags**.
//!
//! The file's values go through the same clap value parsers as the flags (they are turned
//! into `--key=value` arguments placed before the user's own), so a file and the command line
//! accept exactly the same values and report the same errors; a key that is no flag of the
//! subcommand is an error naming the known keys. A flag given on the command line, or set
//! through its environment variable, wins over the file. `PROGRAM SUBCOMMAND --print-config`
//! style dumps are the binaries' business (they derive `serde::Serialize` on their options).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, Command};

/// The name of the file option every configurable subcommand declares (`--config FILE`).
pub const CONFIG_FLAG: &str = "config";
/// The flag that prints the effective options as a file (not itself a file key).
pub const PRINT_CONFIG_FLAG: &str = "print-config";

/// Whether a file may set the flag `long` (not the file option and not the print switch).
fn file_key(long: &str) -> bool {
    long != CONFIG_FLAG && long != PRINT_CONFIG_FLAG && long != "help" && long != "version"
}

/// What can be wrong with an options file.
#[derive(Debug, thiserror::Error)]
pub enum OptionsError {
    #[error("--config {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("--config {path}: not valid TOML: {message}")]
    Toml { path: PathBuf, message: String },
    #[error("--config {path}: unknown key {key:?}; `{command}` takes: {known}")]
    UnknownKey {
        path: PathBuf,
        key: String,
        command: String,
        known: String,
    },
    #[error("--config {path}: key {key:?} must be {expected}, found {found}")]
    BadValue {
        path: PathBuf,
        key: String,
        expected: &'static str,
        found: String,
    },
}

/// The two options every configurable subcommand flattens in: `--config FILE` and
/// `--print-config`.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct ConfigArgs {
    /// TOML file of options: its keys are this command's long flags; flags and environment
    /// variables override it. `--print-config` writes one. (A command shows its own keys as
    /// examples with `#[command(mut_arg("config", |a| a.help(..)))]`.)
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print the effective options (defaults, file, environment and flags merged) as a
    /// `--config` file and exit.
    #[arg(long)]
    pub print_config: bool,
}

impl ConfigArgs {
    /// With `--print-config`: the effective `options` as a `--config` file (TOML); `None`
    /// otherwise.
    ///
    /// Errors: `options` has a value TOML cannot hold.
    pub fn printed<T: serde::Serialize>(&self, options: &T) -> Result<Option<String>, toml::ser::Error> {
        self.print_config.then(|| toml::to_string(options)).transpose()
    }
}

/// Parses the process's command line as `T`, with the values of its subcommand's
/// `--config FILE` applied below the flags and the environment. Like `T::parse()`, prints
/// help, version or a usage error and exits for those; a `--config` file that cannot be read,
/// is not TOML or has a key or value no flag takes ([`with_config_file`]'s errors) is a usage
/// error too: `error: ` and the reason on one line, exit code 2, as clap's own (a value of the
/// file that a flag's parser refuses is reported by clap itself, exit code 2).
pub fn parse<T: clap::Parser>() -> T {
    let argv: Vec<OsString> = std::env::args_os().collect();
    let command = T::command();
    let matches = command.clone().get_matches_from(argv.clone());
    let argv = with_config_file(&command, &matches, argv).unwrap_or_else(|e| {
        eprintln!("error: {}", error_chain(&e));
        std::process::exit(2)
    });
    let matches = command.get_matches_from(argv);
    T::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// The exit code of a binary's `run()`: success, or 1 after printing `error: ` and the error
/// with its causes on one line (see [`error_chain`]). Binaries use it in place of
/// `main() -> anyhow::Result<()>`, whose report prints every cause twice when a message
/// already quotes its source.
pub fn exit_code<E: AsRef<dyn std::error::Error + 'static>>(result: Result<(), E>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", error_chain(e.as_ref()));
            std::process::ExitCode::FAILURE
        }
    }
}

/// An error and its causes joined by `": "`, leaving out a cause whose text the message so
/// far already holds (most of this workspace's errors quote their source, e.g.
/// `reading {path}: {source}`, and also return it from `source()`).
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut message = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        cause = c.source();
    }
    message
}

/// Exits with code 2 and `error: {e}` on one line, as clap reports its own usage errors, when
/// `check` failed: for a combination of options clap cannot check (an image option without
/// `--mmproj`, an image-token budget with min > max), before anything is loaded.
pub fn exit_on_usage_error<E: std::fmt::Display>(check: Result<(), E>) {
    if let Err(e) = check {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
}

/// Runs `write` on the locked standard output and flushes it. A reader that went away (a
/// broken pipe: `tandem-tools dry-run | head -1`) ends the process quietly with exit code 0,
/// the normal end of a pipeline, instead of a panic in `println!`. SIGPIPE is not reset to
/// its default for this: that would also kill a server writing to a closed socket.
///
/// Errors: any other error writing to standard output.
pub fn write_stdout(write: impl FnOnce(&mut std::io::StdoutLock<'static>) -> std::io::Result<()>) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match write(&mut out).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        other => other,
    }
}

/// Returns `argv` with the values of the `--config FILE` of its subcommand (if any) inserted
/// as flags right after the subcommand's name, skipping every key the command line or the
/// environment already sets. `matches` are `command`'s matches for `argv` (a first parse);
/// `argv` is returned unchanged when the subcommand has no `--config` or it is not given.
///
/// Errors: the file cannot be read, is not TOML, has a key that is no long flag of the
/// subcommand (or is `config` itself), or a value that is a table, or an array for a
/// single-valued flag that takes no list.
pub fn with_config_file(
    command: &Command,
    matches: &ArgMatches,
    argv: Vec<OsString>,
) -> Result<Vec<OsString>, OptionsError> {
    let Some((name, sub_matches)) = matches.subcommand() else {
        return Ok(argv);
    };
    let Some(sub) = command.find_subcommand(name) else {
        return Ok(argv);
    };
    if sub.get_arguments().all(|a| a.get_id() != CONFIG_FLAG) {
        return Ok(argv);
    }
    let Some(path) = sub_matches.get_one::<PathBuf>(CONFIG_FLAG) else {
        return Ok(argv);
    };
    let text = std::fs::read_to_string(path).map_err(|source| OptionsError::Read {
        path: path.clone(),
        source,
    })?;
    let injected = file_args(sub, sub_matches, path, &text)?;
    // Insert after the first occurrence of the subcommand's name (argv[0] is the program).
    let at = argv
        .iter()
        .skip(1)
        .position(|a| a.to_str() == Some(name))
        .map_or(argv.len(), |i| i + 2);
    let mut out = argv[..at].to_vec();
    out.extend(injected);
    out.extend_from_slice(&argv[at..]);
    Ok(out)
}

/// The `--key=value` arguments for the keys of `text` that neither the command line nor the
/// environment set for `sub`.
fn file_args(
    sub: &Command,
    matches: &ArgMatches,
    path: &Path,
    text: &str,
) -> Result<Vec<OsString>, OptionsError> {
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| OptionsError::Toml {
        path: path.to_path_buf(),
        message: e.message().to_string(),
    })?;
    let mut out = Vec::new();
    for (key, value) in &table {
        let arg = sub
            .get_arguments()
            .find(|a| a.get_long() == Some(key.as_str()) && file_key(key))
            .ok_or_else(|| OptionsError::UnknownKey {
                path: path.to_path_buf(),
                key: key.clone(),
                command: sub.get_name().to_string(),
                known: known_keys(sub),
            })?;
        let source = matches.value_source(arg.get_id().as_str());
        if matches!(source, Some(ValueSource::CommandLine | ValueSource::EnvVariable)) {
            continue;
        }
        let bad = |expected: &'static str| OptionsError::BadValue {
            path: path.to_path_buf(),
            key: key.clone(),
            expected,
            found: value.to_string(),
        };
        let flag = format!("--{key}");
        match (arg.get_action(), value) {
            (ArgAction::SetTrue, toml::Value::Boolean(b)) => {
                if *b {
                    out.push(flag.into());
                }
            }
            (ArgAction::SetFalse, toml::Value::Boolean(b)) => {
                if !*b {
                    out.push(flag.into());
                }
            }
            (ArgAction::SetTrue | ArgAction::SetFalse, _) => return Err(bad("true or false")),
            (ArgAction::Append, toml::Value::Array(items)) => {
                for item in items {
                    out.push(format!("{flag}={}", scalar(item).ok_or_else(|| bad("a list of plain values"))?).into());
                }
            }
            (_, toml::Value::Array(items)) => {
                let parts: Option<Vec<String>> = items.iter().map(scalar).collect();
                let parts = parts.ok_or_else(|| bad("a list of plain values"))?;
                out.push(format!("{flag}={}", parts.join(",")).into());
            }
            (_, v) => {
                let s = scalar(v).ok_or_else(|| bad("a plain value (string, number, boolean)"))?;
                out.push(format!("{flag}={s}").into());
            }
        }
    }
    Ok(out)
}

/// A TOML scalar as the text a flag would carry; `None` for tables and arrays.
fn scalar(v: &toml::Value) -> Option<String> {
    match v {
        toml::Value::String(s) => Some(s.clone()),
        toml::Value::Integer(i) => Some(i.to_string()),
        toml::Value::Float(f) => Some(f.to_string()),
        toml::Value::Boolean(b) => Some(b.to_string()),
        toml::Value::Datetime(d) => Some(d.to_string()),
        toml::Value::Array(_) | toml::Value::Table(_) => None,
    }
}

/// The long flags of `sub` a file may set, comma-separated.
fn known_keys(sub: &Command) -> String {
    let mut keys: Vec<&str> = sub
        .get_arguments()
        .filter(|a| !a.is_hide_set())
        .filter_map(|a| a.get_long())
        .filter(|l| file_key(l))
        .collect();
    keys.sort_unstable();
    keys.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Args, Parser, Subcommand};

    /// An error whose message may or may not quote its source.
    #[derive(Debug)]
    struct Layer {
        text: String,
        source: Option<Box<Layer>>,
    }

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(&self.text)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.source.as_deref().map(|s| s as _)
        }
    }

    #[test]
    fn error_chain_prints_each_cause_once() {
        let os = Layer { text: "No such file or directory (os error 2)".into(), source: None };
        // A message that quotes its source: the source is not repeated.
        let quoting = Layer { text: format!("reading /m.gguf: {os}"), source: Some(Box::new(os)) };
        // A context line that does not: the cause is appended.
        let context = Layer { text: "loading the model".into(), source: Some(Box::new(quoting)) };
        assert_eq!(
            error_chain(&context),
            "loading the model: reading /m.gguf: No such file or directory (os error 2)"
        );
        assert_eq!(error_chain(&Layer { text: "plain".into(), source: None }), "plain");
        // tonic's transport error: a context line whose cause repeats it before the OS error.
        let os = Layer { text: "Connection refused (os error 111)".into(), source: None };
        let connect = Layer { text: "tcp connect error".into(), source: Some(Box::new(os)) };
        let outer = Layer { text: "tcp connect error".into(), source: Some(Box::new(connect)) };
        let transport = Layer { text: "transport error".into(), source: Some(Box::new(outer)) };
        assert_eq!(error_chain(&transport), "transport error: tcp connect error: Connection refused (os error 111)");
    }

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(subcommand)]
        cmd: Cmd,
    }

    #[derive(Subcommand, Debug)]
    enum Cmd {
        Serve(ServeArgs),
    }

    #[derive(Args, Debug)]
    struct ServeArgs {
        #[arg(long)]
        config: Option<PathBuf>,
        #[arg(long, default_value_t = 512)]
        micro_batch: usize,
        #[arg(long = "worker", default_value = "a")]
        workers: Vec<String>,
        #[arg(long, default_value_t = true, action = ArgAction::Set)]
        consolidate: bool,
        #[arg(long)]
        json: bool,
        #[arg(long, env = "TANDEM_OPTIONS_TEST_MODEL")]
        model: Option<String>,
        #[arg(long, default_value = "x,y")]
        drafters: String,
    }

    fn parse(args: &[&str], file: &str) -> Result<ServeArgs, String> {
        let dir = std::env::temp_dir().join(format!("tandem-options-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{}.toml", args.len() * 7 + file.len()));
        std::fs::write(&path, file).unwrap();
        let mut argv: Vec<OsString> = vec!["prog".into(), "serve".into(), "--config".into(), path.clone().into()];
        argv.extend(args.iter().map(OsString::from));
        let cmd = <Cli as clap::CommandFactory>::command();
        let m = cmd.clone().try_get_matches_from(argv.clone()).map_err(|e| e.to_string())?;
        let argv = with_config_file(&cmd, &m, argv).map_err(|e| e.to_string())?;
        let Cmd::Serve(s) = Cli::try_parse_from(argv).map_err(|e| e.to_string())?.cmd;
        Ok(s)
    }

    #[test]
    fn file_sets_defaults_and_flags_win() {
        let s = parse(
            &["--micro-batch", "64"],
            "micro-batch = 128\nworker = [\"p\", \"q\"]\nconsolidate = false\njson = true\ndrafters = [\"x\"]\n",
        )
        .unwrap();
        assert_eq!(s.micro_batch, 64, "the flag wins over the file");
        assert_eq!(s.workers, ["p", "q"]);
        assert!(!s.consolidate);
        assert!(s.json);
        assert_eq!(s.drafters, "x");
        let s = parse(&[], "micro-batch = 128\n").unwrap();
        assert_eq!(s.micro_batch, 128, "the file wins over the default");
        assert_eq!(s.workers, ["a"]);
    }

    #[test]
    fn environment_wins_over_the_file() {
        std::env::set_var("TANDEM_OPTIONS_TEST_MODEL", "from-env");
        let s = parse(&[], "model = \"from-file\"\n").unwrap();
        std::env::remove_var("TANDEM_OPTIONS_TEST_MODEL");
        assert_eq!(s.model.as_deref(), Some("from-env"));
    }

    #[test]
    fn bad_files_are_clear_errors() {
        let e = parse(&[], "micro_batch = 1\n").unwrap_err();
        assert!(e.contains("unknown key \"micro_batch\"") && e.contains("micro-batch"), "{e}");
        let e = parse(&[], "micro-batch = \"lots\"\n").unwrap_err();
        assert!(e.contains("micro-batch") && e.contains("lots"), "{e}");
        let e = parse(&[], "json = 3\n").unwrap_err();
        assert!(e.contains("true or false"), "{e}");
        let e = parse(&[], "micro-batch = [\n").unwrap_err();
        assert!(e.contains("not valid TOML"), "{e}");
        let e = parse(&[], "config = \"other.toml\"\n").unwrap_err();
        assert!(e.contains("unknown key \"config\""), "{e}");
    }
}
