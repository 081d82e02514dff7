//! Option files for clap command lines: `PROGRAM SUBCOMMAND --config FILE` reads a TOML file
//! whose keys are that subcommand's long flags (`micro-batch = 256`, `worker = ["http://..."]`,
//! `consolidate = false`) and applies them with the precedence
//! **defaults < file < environment < flags**.
//!
//! The file's values go through the same clap value parsers as the flags (they are turned
//! into `--key=value` arguments placed before the user's own), so a file and the command line
//! accept the same values; a file's value must also be of the TOML type its flag's values are
//! (a quoted string for a path or a name, an integer for a count), and a refused value is
//! reported naming the file and the key (`config file F: key "micro-batch": expected a
//! positive integer, got "abc"`), not the `--flag` it became. A key that is no flag of the
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

/// What can be wrong with an options file. Every message starts with `config file PATH: `;
/// one about a value names its key and the value as the file writes it.
#[derive(Debug, thiserror::Error)]
pub enum OptionsError {
    #[error("config file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {path}: not valid TOML: {message}")]
    Toml { path: PathBuf, message: String },
    #[error("config file {path}: unknown key {key:?}; `{command}` takes: {known}")]
    UnknownKey {
        path: PathBuf,
        key: String,
        command: String,
        known: String,
    },
    /// A value of the wrong kind (a number for a path, text for a number).
    #[error("config file {path}: key {key:?}: expected {expected}, got {found}")]
    BadValue {
        path: PathBuf,
        key: String,
        expected: String,
        found: String,
    },
    /// A value of the right kind that the flag's parser refuses, and why.
    #[error("config file {path}: key {key:?}: invalid value {found}: {reason}")]
    Refused {
        path: PathBuf,
        key: String,
        found: String,
        reason: String,
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
/// error too: `error: ` and the reason on one line naming the file and the key, exit code 2,
/// as clap's own.
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

/// The exit codes of the binaries, for their `--help` (`after_help`).
pub const EXIT_CODES: &str = "Exit codes: 0 done; 1 failed while running (a model that does not load, a server that cannot be reached or refuses); 2 usage error: a bad flag, a bad --config file, or a file the command line names that cannot be read or used (model, token or TLS file).";

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

/// The value of `result`, or (when it failed) exit with code 2 and `error: ` and the error
/// with its causes on one line ([`error_chain`]), as clap reports its usage errors: for what
/// the command line names and cannot be used (a token file that cannot be read or holds no
/// token, a TLS file that is not PEM), found before anything starts.
pub fn or_usage_error<T, E: std::error::Error + 'static>(result: Result<T, E>) -> T {
    result.unwrap_or_else(|e| {
        eprintln!("error: {}", error_chain(&e));
        std::process::exit(2)
    })
}

/// Whether each `(flag, path)` names a file this process can open for reading, for the input
/// files of a command line (`--model`, `--mmproj`), checked before anything starts so that a
/// missing one is a usage error ([`exit_on_usage_error`]) as a bad flag is.
///
/// Errors: `FLAG PATH: ` and why, for the first that does not exist, cannot be opened or is
/// a folder.
pub fn check_readable(files: &[(&str, &Path)]) -> Result<(), String> {
    for (flag, path) in files {
        let why = match std::fs::File::open(path).and_then(|f| f.metadata()) {
            Ok(m) if m.is_dir() => "is a folder, not a file".to_string(),
            Ok(_) => continue,
            Err(e) => e.to_string(),
        };
        return Err(format!("{flag} {}: {why}", path.display()));
    }
    Ok(())
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
/// `argv` is returned unchanged when the subcommand has no `--config` or it is not given. The
/// values of keys the command line or the environment set are checked too (a bad file is an
/// error even where it is overridden).
///
/// Errors: the file cannot be read, is not TOML, has a key that is no long flag of the
/// subcommand (or is `config` itself), a value that is a table, an array for a
/// single-valued flag that takes no list, a value of the wrong TOML type for its flag (a
/// number for a path or a string, a string or a fraction for an integer, anything but
/// `true`/`false` for a switch), or a value the flag's own parser refuses.
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
/// environment set for `sub`; every key's value is checked, those too.
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
    let mut args = Vec::new();
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
        // A key the command line or the environment sets is checked all the same (the file
        // is wrong either way), but not applied.
        let source = matches.value_source(arg.get_id().as_str());
        let overridden = matches!(source, Some(ValueSource::CommandLine | ValueSource::EnvVariable));
        let mut out = Vec::new();
        let bad = |expected: &str, found: &toml::Value| OptionsError::BadValue {
            path: path.to_path_buf(),
            key: key.clone(),
            expected: expected.to_string(),
            found: found.to_string(),
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
            (ArgAction::SetTrue | ArgAction::SetFalse, v) => return Err(bad("true or false", v)),
            (ArgAction::Append, toml::Value::Array(items)) => {
                for item in items {
                    let text = scalar(item).ok_or_else(|| bad("a list of plain values", value))?;
                    check_value(arg, item, &text).map_err(|e| e.at(path, key))?;
                    out.push(format!("{flag}={text}").into());
                }
            }
            (_, toml::Value::Array(items)) => {
                let parts: Option<Vec<String>> = items.iter().map(scalar).collect();
                let parts = parts.ok_or_else(|| bad("a list of plain values", value))?;
                let text = parts.join(",");
                for item in items {
                    check_kind(arg, item).map_err(|e| e.at(path, key))?;
                }
                check_value(arg, value, &text).map_err(|e| e.at(path, key))?;
                out.push(format!("{flag}={text}").into());
            }
            (_, v) => {
                let text = scalar(v).ok_or_else(|| bad("a plain value (string, number, boolean)", v))?;
                check_value(arg, v, &text).map_err(|e| e.at(path, key))?;
                out.push(format!("{flag}={text}").into());
            }
        }
        if !overridden {
            args.extend(out);
        }
    }
    Ok(args)
}

/// A file's value that its flag does not take, before the file and key are known.
enum ValueProblem {
    /// The wrong TOML type: what the flag expects, and the value.
    Kind { expected: String, found: String },
    /// The flag's parser refused the value, and why.
    Refused { found: String, reason: String },
}

impl ValueProblem {
    fn at(self, path: &Path, key: &str) -> OptionsError {
        let (path, key) = (path.to_path_buf(), key.to_string());
        match self {
            ValueProblem::Kind { expected, found } => OptionsError::BadValue { path, key, expected, found },
            ValueProblem::Refused { found, reason } => OptionsError::Refused { path, key, found, reason },
        }
    }
}

/// The kind of value a flag takes, as far as a TOML type can say it.
enum Kind {
    /// Text: a path or a string (a TOML number or boolean there is a mistake).
    Text(&'static str),
    /// A whole number; `signed` when it may be negative.
    Integer { signed: bool },
    Float,
    Bool,
    /// A type of its own, parsed from text (an address, a name from a list, a size).
    Other,
}

fn kind(arg: &clap::Arg) -> Kind {
    use std::any::TypeId;
    let t = arg.get_value_parser().type_id();
    let any = |ids: &[TypeId]| ids.iter().any(|id| t == *id);
    if t == TypeId::of::<PathBuf>() {
        Kind::Text("a path (a string in quotes)")
    } else if any(&[TypeId::of::<String>(), TypeId::of::<OsString>()]) {
        Kind::Text("a string (in quotes)")
    } else if any(&[TypeId::of::<u8>(), TypeId::of::<u16>(), TypeId::of::<u32>(), TypeId::of::<u64>(), TypeId::of::<usize>()]) {
        Kind::Integer { signed: false }
    } else if any(&[TypeId::of::<i8>(), TypeId::of::<i16>(), TypeId::of::<i32>(), TypeId::of::<i64>(), TypeId::of::<isize>()]) {
        Kind::Integer { signed: true }
    } else if any(&[TypeId::of::<f32>(), TypeId::of::<f64>()]) {
        Kind::Float
    } else if t == TypeId::of::<bool>() {
        Kind::Bool
    } else {
        Kind::Other
    }
}

/// What `arg` expects, in words; `None` for a type of its own (its parser's reason says).
fn expected(arg: &clap::Arg) -> Option<String> {
    Some(match kind(arg) {
        Kind::Text(what) => what.to_string(),
        Kind::Integer { signed: true } => "an integer".to_string(),
        // A flag whose parser refuses 0 (`range(1..)`, `at_least_one`) takes a positive one.
        Kind::Integer { signed: false } if parse_value(arg, "0").is_err() => "a positive integer".to_string(),
        Kind::Integer { signed: false } => "a non-negative integer".to_string(),
        Kind::Float => "a number".to_string(),
        Kind::Bool => "true or false".to_string(),
        Kind::Other => return None,
    })
}

/// Whether the TOML type of `item` fits the kind of value `arg` takes.
fn check_kind(arg: &clap::Arg, item: &toml::Value) -> Result<(), ValueProblem> {
    use toml::Value as V;
    let fits = match (kind(arg), item) {
        (Kind::Text(_), V::String(_)) => true,
        (Kind::Text(_), _) => false,
        (Kind::Integer { .. }, V::Integer(_)) => true,
        (Kind::Integer { .. }, _) => false,
        (Kind::Float, V::Integer(_) | V::Float(_)) => true,
        (Kind::Float, _) => false,
        (Kind::Bool, V::Boolean(_)) => true,
        (Kind::Bool, _) => false,
        (Kind::Other, _) => true,
    };
    if fits {
        return Ok(());
    }
    Err(ValueProblem::Kind { expected: expected(arg).unwrap_or_default(), found: item.to_string() })
}

/// Checks a file's `value` (whose flag text is `text`) against `arg`: its TOML type (for a
/// scalar), then `arg`'s own parser, so that a refusal names the file's key and not a flag.
fn check_value(arg: &clap::Arg, value: &toml::Value, text: &str) -> Result<(), ValueProblem> {
    if !value.is_array() {
        check_kind(arg, value)?;
    }
    let Err(e) = parse_value(arg, text) else {
        return Ok(());
    };
    let found = value.to_string();
    // A number that does not parse as the flag's number type (-1 for an unsigned one):
    // what is expected says it better than "invalid digit found in string".
    let source = std::error::Error::source(&e);
    let plain = match source {
        Some(s) => s.is::<std::num::ParseIntError>() || s.is::<std::num::ParseFloatError>(),
        None => e.kind() != clap::error::ErrorKind::InvalidValue,
    };
    if let Some(expected) = expected(arg).filter(|_| plain) {
        return Err(ValueProblem::Kind { expected, found });
    }
    let reason = match (source, e.get(clap::error::ContextKind::ValidValue)) {
        (Some(s), _) => s.to_string(),
        (None, Some(clap::error::ContextValue::Strings(valid))) => format!("expected one of: {}", valid.join(", ")),
        (None, _) => e.kind().to_string(),
    };
    Err(ValueProblem::Refused { found, reason })
}

/// Runs `arg`'s value parser on `text`, as `--key=text` would.
fn parse_value(arg: &clap::Arg, text: &str) -> Result<(), clap::Error> {
    let mut probe = clap::Arg::new("value")
        .long("value")
        .action(ArgAction::Set)
        .value_parser(arg.get_value_parser().clone())
        .ignore_case(arg.is_ignore_case_set());
    if let Some(d) = arg.get_value_delimiter() {
        probe = probe.value_delimiter(d);
    }
    Command::new("config")
        .no_binary_name(true)
        .arg(probe)
        .try_get_matches_from([format!("--value={text}")])
        .map(drop)
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
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        threads: Option<u32>,
        #[arg(long)]
        file: Option<PathBuf>,
        #[arg(long, value_parser = ["fast", "slow"])]
        mode: Option<String>,
    }

    fn parse(args: &[&str], file: &str) -> Result<ServeArgs, String> {
        let dir = std::env::temp_dir().join(format!("tandem-options-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // One file per call: the tests run at once.
        static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = dir.join(format!("{call}.toml"));
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

    #[test]
    fn unreadable_files_name_their_flag() {
        let dir = std::env::temp_dir().join(format!("tandem-options-read-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("m.gguf");
        std::fs::write(&file, "x").unwrap();
        assert_eq!(check_readable(&[("--model", &file)]), Ok(()));
        let missing = dir.join("none.gguf");
        let e = check_readable(&[("--model", &file), ("--mmproj", &missing)]).unwrap_err();
        assert_eq!(e, format!("--mmproj {}: No such file or directory (os error 2)", missing.display()));
        let e = check_readable(&[("--model", &dir)]).unwrap_err();
        assert!(e.ends_with(": is a folder, not a file"), "{e}");
    }

    /// A value of the wrong kind, or one the flag's parser refuses, names the file and the
    /// key (not the `--flag` the file's value became) and the value as the file writes it.
    #[test]
    fn bad_values_name_the_file_and_the_key() {
        let bad = |file: &str| {
            let e = parse(&[], file).unwrap_err();
            assert!(e.starts_with("config file ") && e.contains(".toml: key \""), "{e}");
            e.split_once(".toml: ").unwrap().1.to_string()
        };
        assert_eq!(bad("micro-batch = \"abc\"\n"), "key \"micro-batch\": expected a non-negative integer, got \"abc\"");
        assert_eq!(bad("micro-batch = -1\n"), "key \"micro-batch\": expected a non-negative integer, got -1");
        assert_eq!(bad("threads = 1.5\n"), "key \"threads\": expected a positive integer, got 1.5");
        assert_eq!(bad("threads = 0\n"), "key \"threads\": invalid value 0: 0 is not in 1..=4294967295");
        assert_eq!(bad("file = 5\n"), "key \"file\": expected a path (a string in quotes), got 5");
        assert_eq!(bad("model = true\n"), "key \"model\": expected a string (in quotes), got true");
        assert_eq!(bad("worker = [\"p\", 5]\n"), "key \"worker\": expected a string (in quotes), got 5");
        assert_eq!(bad("consolidate = \"no\"\n"), "key \"consolidate\": expected true or false, got \"no\"");
        assert_eq!(bad("mode = \"medium\"\n"), "key \"mode\": invalid value \"medium\": expected one of: fast, slow");
        assert_eq!(bad("threads = \"two\"\n"), "key \"threads\": expected a positive integer, got \"two\"");
        let e = parse(&["--threads", "2"], "threads = \"two\"\n").unwrap_err();
        assert!(e.ends_with("key \"threads\": expected a positive integer, got \"two\""), "checked where the flag overrides it: {e}");
        let s = parse(&[], "file = \"5\"\nthreads = 2\nmode = \"slow\"\n").unwrap();
        assert_eq!((s.file.as_deref(), s.threads, s.mode.as_deref()), (Some(Path::new("5")), Some(2), Some("slow")));
    }
}
