// tandem-router (see services/bin/router_main.h).
#include "services/bin/router_main.h"

int main(int argc, char** argv) { return tandem::RunRouter(argc, argv); }
