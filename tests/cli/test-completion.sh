#!/bin/bash
# The shell completions as a user meets them. The installed scripts are what
# `gpuipcctl completion SHELL` prints (one source: the option tables that also parse the options
# and print --help). bash's is sourced and asked to complete commands, global and per-command
# options (for every command, exactly the options its --help lists, deprecated spellings left out),
# kinds, shells, and buffer names asked of a real broker. fish's is asked the same through
# `complete -C`; zsh's is parsed (zsh -n) and loaded. zsh or fish missing: their part is skipped,
# saying so.
#   test-completion.sh GPUIPCCTL BASH-FILE ZSH-FILE FISH-FILE     (env: GPUIPC_BROKER)
set -uo pipefail
ctl=$1 bash_file=$2 zsh_file=$3 fish_file=$4
dir=$(mktemp -d /tmp/gpuipc-completion.XXXXXX)
broker=
pub=
cleanup() {
        [[ -n $pub ]] && { kill "$pub" 2>/dev/null; wait "$pub" 2>/dev/null; }
        [[ -n $broker ]] && { kill "$broker" 2>/dev/null; wait "$broker" 2>/dev/null; }
        rm -rf "$dir"
}
trap cleanup EXIT
failures=0
pass() { echo "ok   $*"; }
fail() { echo "FAIL $*"; failures=$((failures + 1)); }
expect() { local what=$1; shift; if "$@"; then pass "$what"; else fail "$what"; fi; }
# The completions are registered for the command name: call it by that name.
mkdir "$dir/bin" && ln -s "$(readlink -f "$ctl")" "$dir/bin/gpuipcctl"
export PATH=$dir/bin:$PATH

for shell in bash zsh fish; do
        file=${shell}_file
        expect "the built $shell completion is what \`gpuipcctl completion $shell\` prints" \
                cmp -s "${!file}" <(gpuipcctl completion "$shell")
done

# A broker with one buffer, for names.
sock=$dir/s.sock
: "${GPUIPC_BROKER:?}"
"$GPUIPC_BROKER" --socket "$sock" --log-level warn 2>"$dir/broker.log" &
broker=$!
gpuipcctl --socket "$sock" --timeout 5000 ping >/dev/null || fail "the broker did not start"
gpuipcctl --socket "$sock" publish frames/cam0 --size 4K >"$dir/pub.out" &
pub=$!
for _ in $(seq 100); do grep -q published "$dir/pub.out" && break; sleep 0.05; done

commands=$(gpuipcctl --help | sed -n '/^Commands:/,/^$/s/^  \([a-z]\+\) .*/\1/p' | sort | tr '\n' ' ')
# The long options a command's --help lists (not its deprecated spellings).
help_options() {
        gpuipcctl $1 --help | sed '/^Deprecated spellings/,$d; /^Global options/,$d' |
                grep -o '^ \+\(-[a-zA-Z], \)\?--[a-z][a-z-]*' | grep -o -- '--[a-z-]*' | sort | tr '\n' ' '
}

# ---- bash ----
# bcomp LINE: what bash offers for the last word of LINE (a trailing space starts a new word).
bcomp() {
        bash -c '
                source "$1"
                read -ra COMP_WORDS <<<"$2"
                [[ $2 == *" " ]] && COMP_WORDS+=("")
                COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
                COMP_LINE=$2 COMP_POINT=${#2}
                _gpuipcctl
                (( ${#COMPREPLY[@]} )) && printf "%s\n" "${COMPREPLY[@]}" | sort | tr "\n" " "
        ' _ "$bash_file" "$1"
}
expect "bash: commands ($(bcomp 'gpuipcctl '))" test "$(bcomp 'gpuipcctl ')" == "$commands"
expect "bash: gpuipcctl pu -> publish" test "$(bcomp 'gpuipcctl pu')" == "publish "
expect "bash: gpuipcctl --so -> --socket" test "$(bcomp 'gpuipcctl --so')" == "--socket "
expect "bash: the global --timeout takes its value before the command" \
        test "$(bcomp 'gpuipcctl --timeout 100 st')" == "stat stats "
for cmd in $commands; do
        want=$(help_options "$cmd")
        got=$(bcomp "gpuipcctl $cmd --" )
        expect "bash: gpuipcctl $cmd -- offers what its --help lists ($got)" test "$got" == "$want"
done
expect "bash: publish's kinds" test "$(bcomp 'gpuipcctl publish x --kind cuda')" == "cuda-legacy cuda-vmm "
expect "bash: a pattern" test "$(bcomp 'gpuipcctl attach x --verify ra')" == "random: "
expect "bash: no options offered as a number's value" test -z "$(bcomp 'gpuipcctl attach x --wait ')"
expect "bash: shells" test "$(bcomp 'gpuipcctl completion ')" == "bash fish zsh "
expect "bash: audit's FILE is a path" test "$(bcomp 'gpuipcctl audit /etc/hostnam')" == "/etc/hostname "
expect "bash: a buffer's name from the broker ($(bcomp "gpuipcctl --socket $sock stat fr"))" \
        test "$(bcomp "gpuipcctl --socket $sock stat fr")" == "frames/cam0 "
expect "bash: after the NAME, options" test "$(bcomp "gpuipcctl --socket $sock attach frames/cam0 --v")" == "--verify "
start=$SECONDS
expect "bash: nothing, at once, without a broker" test -z "$(bcomp 'gpuipcctl --socket /nonexistent stat fr')"
expect "... within 3 s ($((SECONDS - start)) s)" test $((SECONDS - start)) -le 3

# ---- zsh ----
if command -v zsh >/dev/null; then
        expect "zsh: the script parses (zsh -n)" zsh -n "$zsh_file"
        out=$(zsh -fc 'compdef() { print -r -- "compdef $*" }; source "$1"' _ "$zsh_file" 2>&1)
        expect "zsh: sourced, it registers itself ($out)" test "$out" == "compdef _gpuipcctl gpuipcctl"
        for cmd in $commands; do
                grep -q "^		$cmd)" "$zsh_file" || fail "zsh: no case for $cmd"
        done
else
        echo "skip zsh: zsh is not installed (./dev.sh installs it)"
fi

# ---- fish ----
if command -v fish >/dev/null; then
        # fcomp LINE: the candidates fish offers (their descriptions cut off).
        fcomp() { fish -c "source '$fish_file'; complete -C '$1'" 2>&1 | cut -f1 | sort | tr '\n' ' '; }
        expect "fish: the script parses (fish -n)" fish -n "$fish_file"
        expect "fish: commands" test "$(fcomp 'gpuipcctl ')" == "$commands"
        expect "fish: gpuipcctl pu -> publish" test "$(fcomp 'gpuipcctl pu')" == "publish "
        expect "fish: publish's kinds" test "$(fcomp 'gpuipcctl publish x --kind cuda')" == "cuda-legacy cuda-vmm "
        for cmd in publish attach stat; do
                want=$(help_options "$cmd")
                got=$(fcomp "gpuipcctl $cmd --")
                expect "fish: gpuipcctl $cmd -- offers what its --help lists ($got)" test "$got" == "$want"
        done
        expect "fish: a buffer's name from the broker" \
                test "$(fcomp "gpuipcctl --socket $sock stat fr")" == "frames/cam0 "
else
        echo "skip fish: fish is not installed (./dev.sh installs it)"
fi

[[ $failures == 0 ]] && echo "all checks passed" || echo "$failures checks failed"
[[ $failures == 0 ]]
