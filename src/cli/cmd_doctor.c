/* cmd_doctor.c: placeholder until its module lands (replaced by the module's owner). */
#include "cli/cli.h"
#include <stdio.h>
int cmd_doctor(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "laststand: error: 'doctor' is not built yet\n");
    return 1;
}
