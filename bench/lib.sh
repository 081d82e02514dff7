# Shared by the bench/*.sh scripts (sourced, not run).

# parse_options PROG HELP_LAST_LINE --flag:VAR... -- "$@"
# Sets VAR to the value after each --flag (every flag takes one value); -h/--help prints lines
# 2..HELP_LAST_LINE of the calling script (its header comment) and exits 0; an unknown
# argument, or a flag without its value, exits 2 naming PROG.
parse_options() {
  local prog=$1 help_end=$2
  shift 2
  local -A var=()
  while [[ $# -gt 0 && $1 != -- ]]; do
    var[${1%%:*}]=${1#*:}
    shift
  done
  shift
  while [[ $# -gt 0 ]]; do
    case "$1" in
      -h|--help) sed -n "2,${help_end}p" "$0"; exit 0 ;;
    esac
    if [[ -z "${var[$1]:-}" ]]; then
      echo "$prog: unknown argument $1" >&2; exit 2
    fi
    if [[ $# -lt 2 ]]; then
      echo "$prog: $1 needs a value" >&2; exit 2
    fi
    printf -v "${var[$1]}" '%s' "$2"
    shift 2
  done
}
