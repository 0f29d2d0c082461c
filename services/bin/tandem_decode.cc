// tandem-decode: a worker whose default role is decode (see services/bin/worker_main.h).
#include "services/bin/worker_main.h"

int main(int argc, char** argv) { return tandem::RunWorker(argc, argv, tandem::v1::ROLE_DECODE, "tandem-decode"); }
