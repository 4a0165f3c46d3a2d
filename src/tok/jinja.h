/* jinja.h: a Jinja2 renderer for Hugging Face chat templates.
 *
 * Implements the subset real HF templates use (see the issue/README), with
 * transformers' settings: trim_blocks=True, lstrip_blocks=True, tojson with
 * ensure_ascii=False and separators (", ", ": "). Variables are a JSON object
 * (messages, tools, add_generation_prompt, bos_token, eos_token and every
 * chat_template_kwargs entry at top level).
 */
#ifndef LS_JINJA_H
#define LS_JINJA_H

#include "base/base.h"
#include <jansson.h>

typedef struct jinja_tmpl jinja_tmpl;

/* Parse a template. On a syntax error: ERR_INVAL and "line L, column C: ...". */
int jinja_parse(const char *src, jinja_tmpl **out, ls_err *e);
void jinja_free(jinja_tmpl *t);

/* Render with vars (a JSON object). *out is malloc'd.
 * raise_exception(msg) -> ERR_INVAL with e->msg == msg exactly and *raised = 1.
 * Other run-time errors -> ERR_INVAL with "line L, column C: ..." . */
int jinja_render(const jinja_tmpl *t, json_t *vars, char **out, int *raised, ls_err *e);

/* Locate the chat template of a model folder: chat_template.jinja, else
 * tokenizer_config.json "chat_template" (string, or list of {name, template}
 * taking "default"). Returns malloc'd text or NULL with e filled. */
char *jinja_find_chat_template(const char *dir, ls_err *e);

/* A named template of a model folder, as transformers resolves names (additive):
 * "default" is what jinja_find_chat_template returns; another NAME comes from
 * additional_chat_templates/NAME.jinja when chat_template.jinja or that folder exist,
 * else from the tokenizer_config.json list entry {"name": NAME}. transformers'
 * apply_chat_template renders "tool_use" instead of "default" when tools are given
 * and the model has one. Returns malloc'd text, or NULL with e filled when absent. */
char *jinja_find_named_chat_template(const char *dir, const char *name, ls_err *e);

/* Convenience: render a chat request the way transformers' apply_chat_template
 * does. req: {"messages":[...], "tools":[...]?, "add_generation_prompt":bool?,
 * "chat_template_kwargs":{...}?}; bos/eos may be NULL. */
int jinja_apply_chat(const jinja_tmpl *t, json_t *req, const char *bos, const char *eos,
                     char **out, int *raised, ls_err *e);

#endif
