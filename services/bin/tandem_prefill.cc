// tandem-prefill: a worker whose default role is prefill (see services/bin/worker_main.h).
#include "services/bin/worker_main.h"

int main(int argc, char** argv) { return tandem::RunWorker(argc, argv, tandem::v1::ROLE_PREFILL, "tandem-prefill"); }
