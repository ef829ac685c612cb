/* gpuipcctl completion bash|zsh|fish: the shell completion scripts, generated from the same command
 * and option tables that parse the options and print --help, so what a shell offers is what
 * gpuipcctl accepts (deprecated spellings are accepted but not offered). Names of buffers and
 * rings come from the broker at completion time, through the internal __complete-names command.
 *
 * What it must never do: offer an option the command refuses, or hang a shell: the names are asked
 * for with a short timeout and any failure completes nothing. */
#include <stdlib.h>
#include <string.h>

#include "ctl.h"

#define NAMES_TIMEOUT_MS 500 /* how long completing a name may wait for the broker */
/* A shell shows every candidate: past a couple of thousand, a list is no help to a person and
 * only slows the completion down. */
#define MAX_NAMES 2000

/* The names gpuipc_kind_from_name accepts (--kind's values): one string, since each shell's
 * script splits it itself. */
static const char *const kinds = "memfd cuda-vmm cuda-legacy";
static const char *const shells = "bash zsh fish";

/* An option with a replacement (o->instead) is deprecated: it still parses, so old scripts keep
 * working, but completing it would teach people the old spelling. */
static bool offered(const CtlOption *o)
{
        return !o->instead;
}

/* The first line of an option's help, quoted for a shell's single quotes: each ' becomes '\'' (sh)
 * or \' (fish), and [ ] become ( ) for zsh's _arguments. */
static void quoted_help(FILE *f, const char *help, bool fish)
{
        for (const char *p = help; *p && *p != '\n'; p++) {
                if (*p == '\'')
                        fputs(fish ? "\\'" : "'\\''", f);
                else if (*p == '\\' && fish)
                        fputs("\\\\", f);
                else if (*p == '[' || *p == ']')
                        fputc(*p == '[' ? '(' : ')', f);
                else
                        fputc(*p, f);
        }
}

/* Every spelling of the options, offered or not, that take a value: " -s --socket ". */
/* The scripts skip these words together with the word after them when they look for the command,
 * so a value such as --socket's path is never taken for the command's name; deprecated spellings
 * are listed too, since a command line typed with one must still be read right. */
static void valued_spellings(FILE *f, const CtlOption *options)
{
        for (const CtlOption *o = options; o && o->id; o++) {
                if (!o->arg)
                        continue;
                if (o->letter)
                        fprintf(f, " -%c", o->letter);
                if (o->name)
                        fprintf(f, " --%s", o->name);
        }
}

/* ---- bash ---- */

/* Offered spellings only: a deprecated one still parses but is not suggested. */
static void bash_words(FILE *f, const CtlOption *options, bool help)
{
        for (const CtlOption *o = options; o && o->id; o++) {
                if (!offered(o))
                        continue;
                if (o->name)
                        fprintf(f, " --%s", o->name);
                if (o->letter)
                        fprintf(f, " -%c", o->letter);
        }
        if (help)
                fputs(" --help -h", f);
}

/* One case arm per value-taking spelling, keyed "command:option", so the same option letter may
 * complete differently under two commands; deprecated spellings included, since a user who
 * typed one still wants its value completed. */
static void bash_value_case(FILE *f, const char *cmd, const CtlOption *options)
{
        for (const CtlOption *o = options; o && o->id; o++) {
                if (!o->arg)
                        continue;
                fputs("\t", f);
                if (o->letter)
                        fprintf(f, "%s:-%c%s", cmd, o->letter, o->name ? "|" : "");
                if (o->name)
                        fprintf(f, "%s:--%s", cmd, o->name);
                switch (o->value) {
                case CTL_VALUE_FILE: fputs(") COMPREPLY=($(compgen -f -- \"$cur\")); return ;;\n", f); break;
                case CTL_VALUE_KIND:
                        fprintf(f, ") COMPREPLY=($(compgen -W \"%s\" -- \"$cur\")); return ;;\n", kinds);
                        break;
                case CTL_VALUE_PATTERN:
                        fputs(") COMPREPLY=($(compgen -W \"counter byte:0x random:\" -- \"$cur\")); compopt -o nospace "
                              "2>/dev/null; return ;;\n",
                              f);
                        break;
                case CTL_VALUE_NAME:
                        fputs(") COMPREPLY=($(compgen -W \"$(_gpuipcctl_names \"$cur\")\" -- \"$cur\")); return ;;\n",
                              f);
                        break;
                default: fputs(") return ;;\n", f); break;
                }
        }
}

/* The bash script: a fixed frame (finding the command word, asking the broker for names) around
 * case arms generated from the tables. Printed to stdout, to be sourced or installed by packagers.
 *
 * _gpuipcctl_names runs the gpuipcctl being completed (COMP_WORDS[0]) with the global options
 * already typed, so names come from the broker the command will talk to; "--" keeps a prefix that
 * starts with '-' an operand, and stderr is dropped so that a broker that is down completes nothing
 * instead of printing into the user's line. With no command yet, a word starting with '-' completes
 * the global options and any other word the commands' names (internal ones, with no summary, are
 * never offered). A command takes one operand at most (ctl_operand refuses a second), so once one
 * is on the line only options are offered. */
static void completion_bash(FILE *f)
{
        fputs("# bash completion for gpuipcctl, generated by `gpuipcctl completion bash` from its option tables.\n"
              "\n"
              "# Names of buffers and rings starting with $1, from the broker the command line names.\n"
              "_gpuipcctl_names() {\n"
              "\t\"${COMP_WORDS[0]}\" \"${_gpuipcctl_global[@]}\" --timeout " , f);
        fprintf(f, "%d", NAMES_TIMEOUT_MS);
        fputs(" __complete-names -- \"$1\" 2>/dev/null\n"
              "}\n"
              "\n"
              "_gpuipcctl() {\n"
              "\tlocal cur=${COMP_WORDS[COMP_CWORD]} prev= cmd= ci=0 i w opts= operand= valued= n=0\n"
              "\tlocal -a _gpuipcctl_global=()\n"
              "\t(( COMP_CWORD > 0 )) && prev=${COMP_WORDS[COMP_CWORD - 1]}\n"
              "\tCOMPREPLY=()\n"
              "\t# The command: the first word that is neither a global option nor its value.\n"
              "\tfor (( i = 1; i < COMP_CWORD; i++ )); do\n"
              "\t\tw=${COMP_WORDS[i]}\n"
              "\t\tcase \" ", f);
        valued_spellings(f, ctl_global_options);
        fputs(" \" in\n"
              "\t\t*\" $w \"*) _gpuipcctl_global+=(\"$w\" \"${COMP_WORDS[i + 1]}\"); (( i++ )); continue ;;\n"
              "\t\tesac\n"
              "\t\tcase $w in\n"
              "\t\t-*) ;;\n"
              "\t\t*) cmd=$w ci=$i; break ;;\n"
              "\t\tesac\n"
              "\tdone\n"
              "\t# An option's value.\n"
              "\tcase $cmd:$prev in\n", f);
        bash_value_case(f, "", ctl_global_options);
        for (size_t i = 0; i < ctl_n_commands; i++)
                if (ctl_commands[i].summary)
                        bash_value_case(f, ctl_commands[i].name, ctl_commands[i].options);
        fputs("\tesac\n"
              "\tif [[ -z $cmd ]]; then\n"
              "\t\tif [[ $cur == -* ]]; then\n"
              "\t\t\tCOMPREPLY=($(compgen -W \"", f);
        bash_words(f, ctl_global_options, false);
        fputs("\" -- \"$cur\"))\n"
              "\t\telse\n"
              "\t\t\tCOMPREPLY=($(compgen -W \"", f);
        for (size_t i = 0; i < ctl_n_commands; i++)
                if (ctl_commands[i].summary)
                        fprintf(f, " %s", ctl_commands[i].name);
        fputs("\" -- \"$cur\"))\n"
              "\t\tfi\n"
              "\t\treturn\n"
              "\tfi\n"
              "\tcase $cmd in\n", f);
        for (size_t i = 0; i < ctl_n_commands; i++) {
                const CtlCommand *c = &ctl_commands[i];

                if (!c->summary)
                        continue;
                fprintf(f, "\t%s) opts=\"", c->name);
                bash_words(f, c->options, true);
                fputs("\" valued=\"", f);
                valued_spellings(f, c->options);
                fprintf(f, " \" operand=%s ;;\n",
                        c->operand == CTL_VALUE_NAME    ? "name"
                        : c->operand == CTL_VALUE_SHELL ? "shell"
                        : c->operand == CTL_VALUE_FILE  ? "file"
                                                        : "");
        }
        fputs("\t*) return ;;\n"
              "\tesac\n"
              "\t# Operands given so far: words that are neither options nor their values.\n"
              "\tfor (( i = ci + 1; i < COMP_CWORD; i++ )); do\n"
              "\t\tw=${COMP_WORDS[i]}\n"
              "\t\tif [[ \"$valued \" == *\" $w \"* ]]; then (( i++ )); elif [[ $w != -* ]]; then (( n++ )); fi\n"
              "\tdone\n"
              "\tif [[ $cur == -* || -z $operand || $n -gt 0 ]]; then\n"
              "\t\tCOMPREPLY=($(compgen -W \"$opts\" -- \"$cur\"))\n"
              "\telif [[ $operand == name ]]; then\n"
              "\t\tCOMPREPLY=($(compgen -W \"$(_gpuipcctl_names \"$cur\")\" -- \"$cur\"))\n"
              "\telif [[ $operand == file ]]; then\n"
              "\t\tCOMPREPLY=($(compgen -f -- \"$cur\"))\n"
              "\telse\n", f);
        fprintf(f, "\t\tCOMPREPLY=($(compgen -W \"%s\" -- \"$cur\"))\n", shells);
        fputs("\tfi\n"
              "}\n"
              "complete -F _gpuipcctl gpuipcctl\n", f);
}

/* ---- zsh ---- */

/* _arguments' action for an option's value: what kind of word follows it. */
static void zsh_action(FILE *f, const CtlOption *o)
{
        switch (o->value) {
        case CTL_VALUE_FILE: fprintf(f, ":%s:_files", o->arg); break;
        case CTL_VALUE_KIND: fprintf(f, ":%s:(%s)", o->arg, kinds); break;
        case CTL_VALUE_PATTERN: fprintf(f, ":%s:_gpuipcctl_patterns", o->arg); break;
        case CTL_VALUE_NAME: fprintf(f, ":%s:_gpuipcctl_names", o->arg); break;
        default: fprintf(f, ":%s: ", o->arg); break;
        }
}

/* One _arguments spec per offered option, with its help's first line as zsh's description. */
static void zsh_specs(FILE *f, const CtlOption *options, const char *indent, bool help)
{
        for (const CtlOption *o = options; o && o->id; o++) {
                if (!offered(o))
                        continue;
                /* The (-x --long) exclusion list: once one spelling is on the line, zsh stops
                 * offering the other. */
                if (o->letter && o->name)
                        fprintf(f, " \\\n%s'(-%c --%s)'{-%c,--%s}'[", indent, o->letter, o->name, o->letter, o->name);
                else if (o->name)
                        fprintf(f, " \\\n%s'--%s[", indent, o->name);
                else
                        fprintf(f, " \\\n%s'-%c[", indent, o->letter);
                quoted_help(f, o->help, false);
                fputc(']', f);
                if (o->arg)
                        zsh_action(f, o);
                fputc('\'', f);
        }
        if (help)
                fprintf(f, " \\\n%s'(- *)'{-h,--help}'[this text]'", indent);
}

/* The zsh script: _arguments for the global options and the command, then one _arguments per
 * command for its own options, so zsh shows each option's help beside it. */
static void completion_zsh(FILE *f)
{
        fputs("#compdef gpuipcctl\n"
              "# zsh completion for gpuipcctl, generated by `gpuipcctl completion zsh` from its option tables.\n"
              "\n"
              "# Names of buffers and rings, from the broker the command line names.\n"
              "_gpuipcctl_names() {\n"
              "\tlocal -a names\n"
              "\tnames=(${(f)\"$($_gpuipcctl_exe $_gpuipcctl_global --timeout ", f);
        fprintf(f, "%d", NAMES_TIMEOUT_MS);
        fputs(" __complete-names -- \"$PREFIX\" 2>/dev/null)\"})\n"
              "\tcompadd -a names\n"
              "}\n"
              "\n"
              "_gpuipcctl_patterns() {\n"
              "\tcompadd counter\n"
              "\tcompadd -S '' byte:0x random:\n"
              "}\n"
              "\n"
              "_gpuipcctl() {\n"
              "\tlocal curcontext=$curcontext state line ret=1 i\n"
              "\tlocal _gpuipcctl_exe=$words[1]\n"
              "\tlocal -a _gpuipcctl_global\n"
              "\tfor (( i = 2; i < CURRENT; i++ )); do\n"
              "\t\tcase \" ", f);
        valued_spellings(f, ctl_global_options);
        fputs(" \" in\n"
              "\t\t*\" $words[i] \"*) _gpuipcctl_global+=($words[i] $words[i+1]); (( i++ )); continue ;;\n"
              "\t\tesac\n"
              "\t\t[[ $words[i] == -* ]] || break\n"
              "\tdone\n"
              "\t_arguments -C", f);
        zsh_specs(f, ctl_global_options, "\t\t", false);
        /* '*::' narrows the words to those from the command on: $line[1] is the command, and a
         * command's own _arguments takes it as its words[1], so its '1:' spec is the operand. */
        fputs(" \\\n\t\t'1:command:->command' \\\n\t\t'*::argument:->argument' && ret=0\n"
              "\tcase $state in\n"
              "\tcommand)\n"
              "\t\tlocal -a commands\n"
              "\t\tcommands=(\n", f);
        for (size_t i = 0; i < ctl_n_commands; i++) {
                if (!ctl_commands[i].summary)
                        continue;
                fprintf(f, "\t\t\t'%s:", ctl_commands[i].name);
                quoted_help(f, ctl_commands[i].summary, false);
                fputs("'\n", f);
        }
        fputs("\t\t)\n"
              "\t\t_describe -t commands command commands && ret=0\n"
              "\t\t;;\n"
              "\targument)\n"
              "\t\tcase $line[1] in\n", f);
        for (size_t i = 0; i < ctl_n_commands; i++) {
                const CtlCommand *c = &ctl_commands[i];

                if (!c->summary)
                        continue;
                fprintf(f, "\t\t%s)\n\t\t\t_arguments", c->name);
                zsh_specs(f, c->options, "\t\t\t\t", true);
                if (c->operand == CTL_VALUE_NAME)
                        fputs(" \\\n\t\t\t\t'1:NAME:_gpuipcctl_names'", f);
                else if (c->operand == CTL_VALUE_SHELL)
                        fprintf(f, " \\\n\t\t\t\t'1:shell:(%s)'", shells);
                else if (c->operand == CTL_VALUE_FILE)
                        fputs(" \\\n\t\t\t\t'1:FILE:_files'", f);
                fputs(" && ret=0\n\t\t\t;;\n", f);
        }
        fputs("\t\tesac\n"
              "\t\t;;\n"
              "\tesac\n"
              "\treturn ret\n"
              "}\n"
              "\n"
              "# Autoloaded from $fpath, or sourced (source <(gpuipcctl completion zsh)).\n"
              "if [[ $zsh_eval_context[-1] == loadautofunc ]]; then\n"
              "\t_gpuipcctl \"$@\"\n"
              "else\n"
              "\tcompdef _gpuipcctl gpuipcctl\n"
              "fi\n", f);
}

/* ---- fish ---- */

/* fish's -x (an argument, no files) versus -r -F (a path): a value that is not a file must not
 * be completed from the directory. */
static void fish_options(FILE *f, const char *condition, const CtlOption *options, bool help)
{
        for (const CtlOption *o = options; o && o->id; o++) {
                if (!offered(o))
                        continue;
                fprintf(f, "complete -c gpuipcctl -n '%s'", condition);
                if (o->letter)
                        fprintf(f, " -s %c", o->letter);
                if (o->name)
                        fprintf(f, " -l %s", o->name);
                if (o->arg) {
                        switch (o->value) {
                        case CTL_VALUE_FILE: fputs(" -r -F", f); break;
                        case CTL_VALUE_KIND: fprintf(f, " -x -a '%s'", kinds); break;
                        case CTL_VALUE_PATTERN: fputs(" -x -a 'counter byte:0x random:'", f); break;
                        case CTL_VALUE_NAME: fputs(" -x -a '(__gpuipcctl_names)'", f); break;
                        default: fputs(" -x", f); break;
                        }
                }
                fputs(" -d '", f);
                quoted_help(f, o->help, true);
                fputs("'\n", f);
        }
        if (help)
                fprintf(f, "complete -c gpuipcctl -n '%s' -s h -l help -d 'this text'\n", condition);
}

/* The fish script: one `complete` line per option, conditioned on the command word found by a
 * helper function, since fish has no per-command argument parser of its own. */
static void completion_fish(FILE *f)
{
        fputs("# fish completion for gpuipcctl, generated by `gpuipcctl completion fish` from its option tables.\n"
              "\n"
              "# The command: the first word that is neither a global option nor its value.\n"
              "function __gpuipcctl_command\n"
              "\tset -l words (commandline -opc)\n"
              "\tset -e words[1]\n"
              "\twhile set -q words[1]\n"
              "\t\tswitch $words[1]\n"
              "\t\t\tcase", f);
        valued_spellings(f, ctl_global_options);
        fputs("\n"
              "\t\t\t\tset -e words[1]\n"
              "\t\t\tcase '-*'\n"
              "\t\t\tcase '*'\n"
              "\t\t\t\techo $words[1]\n"
              "\t\t\t\treturn\n"
              "\t\tend\n"
              "\t\tset -e words[1]\n"
              "\tend\n"
              "end\n"
              "\n"
              "# Whether the command is $argv[1] (none given yet: no argument).\n"
              "function __gpuipcctl_using\n"
              "\ttest \"$argv[1]\" = \"$(__gpuipcctl_command)\"\n"
              "end\n"
              "\n"
              "# Names of buffers and rings, from the broker the command line names.\n"
              "function __gpuipcctl_names\n"
              "\tset -l words (commandline -opc)\n"
              "\tset -l global\n"
              "\tfor i in (seq 2 (count $words))\n"
              "\t\tswitch $words[$i]\n"
              "\t\t\tcase", f);
        valued_spellings(f, ctl_global_options);
        fputs("\n"
              "\t\t\t\tset -q words[(math $i + 1)]; and set -a global $words[$i] $words[(math $i + 1)]\n"
              "\t\tend\n"
              "\tend\n", f);
        /* Names are asked of the same executable the line starts with, as in bash; when fish
         * cannot find it as a command there is no one to ask, and nothing is completed. */
        fputs("\tcommand -q -- $words[1]; or return\n", f);
        fprintf(f, "\t$words[1] $global --timeout %d __complete-names -- (commandline -ct) 2>/dev/null\n",
                NAMES_TIMEOUT_MS);
        /* -f: no file names by default; only options whose value is a path (-r -F) complete from
         * the directory. */
        fputs("end\n"
              "\n"
              "complete -c gpuipcctl -f\n", f);
        fish_options(f, "__gpuipcctl_using", ctl_global_options, false);
        for (size_t i = 0; i < ctl_n_commands; i++) {
                if (!ctl_commands[i].summary)
                        continue;
                fprintf(f, "complete -c gpuipcctl -n __gpuipcctl_using -a %s -d '", ctl_commands[i].name);
                quoted_help(f, ctl_commands[i].summary, true);
                fputs("'\n", f);
        }
        for (size_t i = 0; i < ctl_n_commands; i++) {
                const CtlCommand *c = &ctl_commands[i];
                char condition[96];

                if (!c->summary)
                        continue;
                snprintf(condition, sizeof(condition), "__gpuipcctl_using %s", c->name);
                fish_options(f, condition, c->options, true);
                if (c->operand == CTL_VALUE_NAME)
                        fprintf(f, "complete -c gpuipcctl -n '%s' -a '(__gpuipcctl_names)'\n", condition);
                else if (c->operand == CTL_VALUE_SHELL)
                        fprintf(f, "complete -c gpuipcctl -n '%s' -a '%s'\n", condition, shells);
                else if (c->operand == CTL_VALUE_FILE)
                        fprintf(f, "complete -c gpuipcctl -n '%s' -F\n", condition);
        }
}

/* completion SHELL: needs no broker, so it works at package build time and in a Dockerfile. */
int cmd_completion(Ctl *ctl, int argc, char **argv)
{
        const char *shell = NULL;
        int c, r;

        if ((c = ctl_next_option(ctl, argc, argv, &r)) < 0)
                return r;
        if ((r = ctl_operand(ctl, argc, argv, true, &shell)) != CTL_CONTINUE)
                return r;
        if (strcmp(shell, "bash") == 0)
                completion_bash(stdout);
        else if (strcmp(shell, "zsh") == 0)
                completion_zsh(stdout);
        else if (strcmp(shell, "fish") == 0)
                completion_fish(stdout);
        else
                return ctl_usage(ctl, "no completion for '%s': bash, zsh or fish", shell);
        return CTL_OK;
}

/* Prints the names under prefix of live buffers (not a ring's parts, NAME@...) and of rings, one
 * per line; quietly nothing when the broker cannot be asked. */
/* Always CTL_OK: a listing that fails completes nothing (or what the pages before it gave), which
 * is all a completion can do with an error; the pages (256 buffers, 64 rings) bound what one call
 * allocates. */
static int print_names(Ctl *ctl, const char *prefix)
{
        gpuipc_buffer_info_t *buffers = calloc(256, sizeof(*buffers));
        gpuipc_ring_info_t *rings = calloc(64, sizeof(*rings));
        uint64_t cursor = 0;
        int printed = 0, n;

        if (!buffers || !rings)
                goto out;
        do {
                n = gpuipc_list_buffers(ctl->c, prefix, &cursor, buffers, 256);
                for (int i = 0; i < n && printed < MAX_NAMES; i++) {
                        /* Live only: only those can be attached; a ring's parts (NAME@...) are the
                         * ring's business and are offered as the ring's name below. */
                        if (buffers[i].state == GPUIPC_STATE_LIVE && !strchr(buffers[i].name, '@') &&
                            buffers[i].name[0]) {
                                /* Raw, one per line: names are validated by the broker to a charset
                                 * with no blanks or control characters. */
                                printf("%s\n", buffers[i].name);
                                printed++;
                        }
                }
        } while (n > 0 && cursor && printed < MAX_NAMES);
        cursor = 0;
        do {
                n = gpuipc_list_rings(ctl->c, prefix, &cursor, rings, 64);
                for (int i = 0; i < n && printed < MAX_NAMES; i++, printed++)
                        printf("%s\n", rings[i].name);
        } while (n > 0 && cursor && printed < MAX_NAMES);
out:
        free(buffers);
        free(rings);
        return CTL_OK;
}

/* __complete-names [PREFIX]: what the scripts call while the user presses Tab. No GPU probe at
 * connect: CUDA's start-up would be felt at every Tab. */
int cmd_complete_names(Ctl *ctl, int argc, char **argv)
{
        const char *prefix = NULL;
        int c, r;

        if ((c = ctl_next_option(ctl, argc, argv, &r)) < 0)
                return r;
        if ((r = ctl_operand(ctl, argc, argv, false, &prefix)) != CTL_CONTINUE)
                return r;
        r = ctl_connect(ctl, false);
        if (r)
                return r;
        return print_names(ctl, prefix && prefix[0] ? prefix : NULL);
}
