/* Options from the command tables: getopt's strings built from a command's CtlOption table, the
 * option lines of --help, deprecated spellings answered with a note, and the one operand. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "ctl.h"

#define MAX_OPTIONS 32 /* the largest table (publish) has ten; the arrays below are sized by it */
#define HELP_COLUMN 26 /* where an option's text starts in --help */

static const CtlOption help_option = { 'h', "help", 'h', NULL, CTL_VALUE_NONE, "this text", NULL };
static const CtlOption no_options[] = { { 0 } };

/* getopt_long's view of one table, built once for the command that runs (getopt keeps pointers
 * into it between calls). */
static struct {
        const CtlOption *table;
        struct option longopts[2 * MAX_OPTIONS + 2];
        char shortopts[6 * MAX_OPTIONS + 4];
} parser;

/* What getopt_long returns for a global option given after the command: apart from the command's
 * own options (0x10000 + index), so that a command never sees one. */
#define GLOBAL_AFTER 0x20000

/* The global options a command also takes after its name (gpuipcctl ls --json): --socket, --json
 * and --timeout, each where the command has no option of the same name or letter (ping's own
 * --timeout is the same thing; publish's deprecated -s is --size). --help and --version are the
 * command's and the tool's. */
static bool global_after(const CtlOption *g)
{
        return g->letter != 'h' && g->letter != 'V';
}

/* The entry of table spelled with this letter, or NULL. */
static const CtlOption *by_letter(const CtlOption *table, int letter)
{
        for (const CtlOption *o = table; o->id; o++)
                if (o->letter && o->letter == letter)
                        return o;
        return NULL;
}

/* The option of table with this long name: a command's own option of a global option's name wins
 * over the global one (build_parser), so a command can give a name its own meaning. */
static const CtlOption *by_name(const CtlOption *table, const char *name)
{
        for (const CtlOption *o = table; o->id; o++)
                if (o->name && strcmp(o->name, name) == 0)
                        return o;
        return NULL;
}

/* Long options return 0x10000 + their index in the table: a long name and a letter of one
 * option may differ in whether they are deprecated (publish's --size and -s). A command's table
 * gets the global options too (global_after), as GLOBAL_AFTER + their index. */
static void build_parser(const CtlOption *table, bool stop_at_operand)
{
        bool command = table != ctl_global_options;
        size_t nl = 0, ns = 0;

        parser.table = table;
        /* '+': the global options end at the command's name, run's at the command it runs; ':': a
         * missing value is told apart. */
        if (stop_at_operand)
                parser.shortopts[ns++] = '+';
        parser.shortopts[ns++] = ':';
        for (const CtlOption *o = table; o->id && nl < MAX_OPTIONS; o++) {
                int has_arg = o->arg ? required_argument : no_argument;

                if (o->name)
                        parser.longopts[nl++] = (struct option){ o->name, has_arg, NULL, 0x10000 + (int)(o - table) };
                if (o->letter) {
                        parser.shortopts[ns++] = o->letter;
                        if (o->arg)
                                parser.shortopts[ns++] = ':';
                }
        }
        for (const CtlOption *g = ctl_global_options; command && g->id; g++) {
                int has_arg = g->arg ? required_argument : no_argument;

                if (!global_after(g))
                        continue;
                if (!by_name(table, g->name))
                        parser.longopts[nl++] = (struct option){ g->name, has_arg, NULL,
                                                                 GLOBAL_AFTER + (int)(g - ctl_global_options) };
                if (!by_letter(table, g->letter)) {
                        parser.shortopts[ns++] = g->letter;
                        if (g->arg)
                                parser.shortopts[ns++] = ':';
                }
        }
        /* -h/--help is every command's; gpuipcctl's own table lists it (main answers it). */
        if (!by_letter(table, 'h')) {
                parser.longopts[nl++] = (struct option){ "help", no_argument, NULL, 'h' };
                parser.shortopts[ns++] = 'h';
        }
        parser.longopts[nl] = (struct option){ 0 };
        parser.shortopts[ns] = 0;
}

/* On stderr, and as a note, not an error: the old spelling still works, and --json's stdout must
 * stay one document. */
void ctl_deprecated(Ctl *ctl, const char *used, const char *instead)
{
        fprintf(stderr, "gpuipcctl%s%s: note: %s is deprecated and will be removed; %s\n", ctl->cmd->name[0] ? " " : "",
                ctl->cmd->name, used, instead);
}

int ctl_next_option(Ctl *ctl, int argc, char **argv, int *ret_exit)
{
        const CtlOption *table = ctl->cmd->options ? ctl->cmd->options : no_options;
        const CtlOption *o;
        bool global = !ctl->cmd->name[0];
        char used[64];
        int c;

        /* Rebuilt when the table changes (global options, then the command's) or getopt was reset
         * (optind 0): the strings must stay valid between getopt_long calls, so they live in the
         * static parser and are not rebuilt on every call. */
        if (parser.table != table || optind == 0)
                build_parser(table, global || ctl->cmd->runs_command);
again:
        c = getopt_long(argc, argv, parser.shortopts, parser.longopts, NULL);
        if (c == -1)
                return 0;
        if (c == '?' || c == ':') {
                *ret_exit = ctl_bad_option(ctl, argc, argv, c);
                return -1;
        }
        /* A global option after the command's name: taken here, never seen by the command. A
         * letter the command's table lacks can only be a global one's, since getopt returns only
         * the letters it was given. */
        o = NULL;
        if (!global && c >= GLOBAL_AFTER)
                o = &ctl_global_options[c - GLOBAL_AFTER];
        else if (!global && c < 0x10000 && c != 'h' && !by_letter(table, c))
                o = by_letter(ctl_global_options, c);
        if (o) {
                if (ctl_global_option(ctl, o->id, optarg) < 0) {
                        *ret_exit = CTL_USAGE;
                        return -1;
                }
                goto again;
        }
        if (c == 'h' && !by_letter(table, 'h')) {
                *ret_exit = ctl_help(ctl);
                return -1;
        }
        if (c >= 0x10000) {
                o = &table[c - 0x10000];
                snprintf(used, sizeof(used), "--%s", o->name);
        } else {
                o = by_letter(table, c); /* getopt returns only the letters the table gave it */
                snprintf(used, sizeof(used), "-%c", c);
        }
        /* A deprecated spelling still works (scripts keep running) and says what to write instead,
         * on stderr, so --json output stays one document. */
        if (o->instead)
                ctl_deprecated(ctl, used, o->instead);
        return o->id;
}

int ctl_operand(Ctl *ctl, int argc, char **argv, bool required, const char **name)
{
        const char *what = ctl->cmd->operand == CTL_VALUE_NAME ? "NAME" : "argument";

        if (ctl->cmd->operand == CTL_VALUE_NONE && optind < argc)
                return ctl_usage(ctl, "unexpected argument '%s'", argv[optind]);
        /* Every command takes one operand at most: a second is a mistake (a name with a space
         * unquoted, say), refused rather than ignored. */
        if (optind + 1 < argc)
                return ctl_usage(ctl, "one %s only (got '%s' and '%s')", what, argv[optind], argv[optind + 1]);
        /* Both the operand and the deprecated --name: refused rather than picking one, since they
         * may differ and either choice could act on the wrong buffer. */
        if (optind < argc && *name)
                return ctl_usage(ctl, "the name twice ('%s' and --name '%s'): give it once, as the %s", argv[optind],
                                 *name, what);
        if (optind < argc)
                *name = argv[optind];
        if (required && !*name)
                return ctl_usage(ctl, "%s is required", what);
        return CTL_CONTINUE;
}

/* One option's line(s): "  -p, --prefix P" padded to HELP_COLUMN, then the text, continuation
 * lines indented to the same column. */
static void print_option(FILE *f, const CtlOption *o)
{
        const char *text = o->help;
        int n;

        if (o->letter && o->name)
                n = fprintf(f, "  -%c, --%s", o->letter, o->name);
        else if (o->name)
                n = fprintf(f, "      --%s", o->name);
        else
                n = fprintf(f, "  -%c", o->letter);
        if (o->arg)
                n += fprintf(f, " %s", o->arg);
        /* An option too long for its column puts its text on the next line, so the texts of all
         * options still start in one column. */
        if (n >= HELP_COLUMN - 1) {
                fputc('\n', f);
                n = 0;
        }
        fprintf(f, "%*s", HELP_COLUMN - n, "");
        for (const char *nl; (nl = strchr(text, '\n')); text = nl + 1)
                fprintf(f, "%.*s\n%*s", (int)(nl - text), text, HELP_COLUMN, "");
        fprintf(f, "%s\n", text);
}

/* --help's option list, from the same table the parser uses, so help cannot drift from what is
 * accepted; deprecated spellings come last, in a section of their own, so the main list shows only
 * what to use. */
void ctl_print_options(FILE *f, const CtlOption *options)
{
        bool any_deprecated = false;

        for (const CtlOption *o = options; o && o->id; o++) {
                if (o->instead)
                        any_deprecated = true;
                else
                        print_option(f, o);
        }
        if (!options || !by_letter(options, 'h'))
                print_option(f, &help_option);
        if (!any_deprecated)
                return;
        fputs("\nDeprecated spellings, still accepted (each prints a note):\n", f);
        for (const CtlOption *o = options; o->id; o++) {
                char spelling[64];

                if (!o->instead)
                        continue;
                if (o->name && o->letter)
                        snprintf(spelling, sizeof(spelling), "-%c, --%s", o->letter, o->name);
                else if (o->name)
                        snprintf(spelling, sizeof(spelling), "--%s", o->name);
                else
                        snprintf(spelling, sizeof(spelling), "-%c", o->letter);
                fprintf(f, "  %-*s%s\n", HELP_COLUMN - 2, spelling, o->instead);
        }
}
