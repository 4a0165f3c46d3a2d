/* cmd_chat_template.c: placeholder until its module lands (replaced by the module's owner). */
#include "cli/cli.h"
#include <stdio.h>
int cmd_chat_template(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "laststand: error: 'chat_template' is not built yet\n");
    return 1;
}
