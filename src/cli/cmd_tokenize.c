/* cmd_tokenize.c: placeholder until its module lands (replaced by the module's owner). */
#include "cli/cli.h"
#include <stdio.h>
int cmd_tokenize(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "laststand: error: 'tokenize' is not built yet\n");
    return 1;
}
