/* cmd_chat_template.c: `laststand chat-template` (DESIGN.md section 2).
 *
 *   laststand chat-template --tokenizer-path DIR [--chat-template FILE] --request FILE
 *
 * Renders the model's own chat template (chat_template.jinja, else the
 * tokenizer_config.json "chat_template"; its "tool_use" template when the request
 * has tools, as transformers does), or FILE's, for a request
 * {"messages", "tools", "add_generation_prompt", "chat_template_kwargs"} the way
 * transformers' apply_chat_template does, with bos/eos/pad/unk_token taken from
 * DIR/tokenizer_config.json (transformers' special_tokens_map). Prints the text raw on stdout (no newline added).
 * Exit 2: bad flags or files, template errors ("FILE: line L, column C: ..."), and
 * the template's raise_exception (its message verbatim). --request - reads stdin.
 */
#include "cli/cli.h"
#include "base/base.h"
#include "tok/jinja.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *f) {
    fprintf(f, "usage: laststand chat-template --tokenizer-path DIR [--chat-template FILE] --request FILE\n"
               "  --tokenizer-path DIR   model or tokenizer folder (chat_template.jinja, tokenizer_config.json)\n"
               "  --chat-template FILE   render this Jinja template instead of the model's own\n"
               "  --request FILE         JSON {\"messages\":[...], \"tools\":[...], \"add_generation_prompt\":true,\n"
               "                         \"chat_template_kwargs\":{...}}; '-' reads stdin\n");
}

/* A special token from tokenizer_config.json: a string or an AddedToken {"content": ...}. */
static char *special_token(json_t *cfg, const char *key) {
    json_t *v = json_object_get(cfg, key);
    if (json_is_string(v)) return xstrdup(json_string_value(v));
    if (json_is_object(v) && json_is_string(json_object_get(v, "content")))
        return xstrdup(json_string_value(json_object_get(v, "content")));
    return NULL;
}

int cmd_chat_template(int argc, char **argv) {
    const char *tok_dir = NULL, *tmpl_path = NULL, *req_path = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        const char **dst = !strcmp(a, "--tokenizer-path") || !strcmp(a, "--model-path") ? &tok_dir
                         : !strcmp(a, "--chat-template") ? &tmpl_path
                         : !strcmp(a, "--request") ? &req_path : NULL;
        if (!dst) {
            fprintf(stderr, "laststand: error: chat-template: unknown flag '%s'\n", a);
            usage(stderr);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "laststand: error: chat-template: flag %s needs a value\n", a);
            return 2;
        }
        *dst = argv[++i];
    }
    if (!tok_dir || !req_path) {
        fprintf(stderr, "laststand: error: chat-template: --tokenizer-path and --request are required\n");
        usage(stderr);
        return 2;
    }

    ls_err e = {0};
    char *tmpl_src = NULL;
    json_error_t je;
    json_t *req = !strcmp(req_path, "-") ? json_loadf(stdin, 0, &je) : json_load_file(req_path, 0, &je);
    if (!req) {
        if (je.line > 0)
            fprintf(stderr, "laststand: error: --request %s: line %d, column %d: %s\n", req_path, je.line, je.column, je.text);
        else
            fprintf(stderr, "laststand: error: --request %s: %s\n", req_path, je.text);
        return 2;
    }
    const char *tmpl_name;
    char cfg_path[4096], origin[8400];
    snprintf(cfg_path, sizeof cfg_path, "%s/tokenizer_config.json", tok_dir);
    if (tmpl_path) {
        tmpl_src = read_file(tmpl_path, NULL, &e);
        tmpl_name = tmpl_path;
        if (!tmpl_src) {
            fprintf(stderr, "laststand: error: --chat-template %s: %s\n", tmpl_path, e.msg);
            json_decref(req);
            return 2;
        }
    } else {
        /* like transformers: the "tool_use" template when tools are given and the model has one */
        json_t *tools = json_object_get(req, "tools");
        bool tool_use = false;
        if (tools && !json_is_null(tools))
            tool_use = (tmpl_src = jinja_find_named_chat_template(tok_dir, "tool_use", &e)) != NULL;
        if (!tmpl_src) tmpl_src = jinja_find_chat_template(tok_dir, &e);
        if (!tmpl_src) {
            fprintf(stderr, "laststand: error: --tokenizer-path %s\n", e.msg);
            json_decref(req);
            return 2;
        }
        /* name the file the template came from, for error messages */
        snprintf(origin, sizeof origin, "%s/%s", tok_dir,
                 tool_use ? "additional_chat_templates/tool_use.jinja" : "chat_template.jinja");
        if (access(origin, F_OK) != 0)
            snprintf(origin, sizeof origin, "%s (chat_template%s)", cfg_path, tool_use ? " \"tool_use\"" : "");
        tmpl_name = origin;
    }

    /* bos/eos as transformers passes them (special_tokens_map); absent file: none */
    char *bos = NULL, *eos = NULL, *pad = NULL, *unk = NULL;
    json_t *cfg = json_load_file(cfg_path, 0, &je);
    if (cfg) {
        bos = special_token(cfg, "bos_token");
        eos = special_token(cfg, "eos_token");
        pad = special_token(cfg, "pad_token");
        unk = special_token(cfg, "unk_token");
        json_decref(cfg);
    }

    int rc = 2;
    jinja_tmpl *t = NULL;
    char *out = NULL;
    /* transformers also passes pad_token/unk_token (its special_tokens_map), under the kwargs */
    json_t *kw = json_object_get(req, "chat_template_kwargs");
    if (json_is_object(req) && (pad || unk) && (!kw || json_is_null(kw) || json_is_object(kw))) {
        json_t *merged = json_object();
        if (pad) json_object_set_new(merged, "pad_token", json_string(pad));
        if (unk) json_object_set_new(merged, "unk_token", json_string(unk));
        if (json_is_object(kw)) json_object_update(merged, kw);
        json_object_set_new(req, "chat_template_kwargs", merged);
    }
    if (jinja_parse(tmpl_src, &t, &e)) {
        fprintf(stderr, "laststand: error: %s: %s\n", tmpl_name, e.msg);
        goto done;
    }
    int raised = 0;
    if (jinja_apply_chat(t, req, bos, eos, &out, &raised, &e)) {
        if (raised) fprintf(stderr, "laststand: error: %s\n", e.msg);
        else if (!strncmp(e.msg, "request", 7)) fprintf(stderr, "laststand: error: --request %s: %s\n", req_path, e.msg);
        else fprintf(stderr, "laststand: error: %s: %s\n", tmpl_name, e.msg);
        rc = err_exit_code(e.code);
        goto done;
    }
    fwrite(out, 1, strlen(out), stdout);
    rc = fflush(stdout) ? 1 : 0;
done:
    free(out);
    jinja_free(t);
    json_decref(req);
    free(tmpl_src);
    free(bos);
    free(eos);
    free(pad);
    free(unk);
    return rc;
}
