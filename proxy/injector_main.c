/* injector_main.c — fencegate-injector: the admission webhook, run as `fencegate injector ...`. */
#include "injector.h"

int main(int argc, char **argv)
{
    return injector_main(argc, argv);
}
