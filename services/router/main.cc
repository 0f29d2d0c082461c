// tandem-router (see services/router/router_main.h).
#include "services/router/router_main.h"

int main(int argc, char** argv) { return tandem::RunRouter(argc, argv); }
