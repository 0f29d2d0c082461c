// tandem-kvstore: the prefix KV block store (see services/bin/kvstore_main.h).
#include "services/bin/kvstore_main.h"

int main(int argc, char** argv) { return tandem::RunKvStore(argc, argv); }
