// Shared by the importers (tools/import.cc, tools/import_lerobot.cc).
#pragma once

#include <string>

namespace conveyor::tools {

// After a failed import: leaves no half-written dataset behind, so that the same command can
// simply be rerun. A folder that existed before (it was empty: DatasetWriter refuses others) is
// emptied; one the import created is removed.
void RemovePartialImport(const std::string& out, bool out_existed);

}  // namespace conveyor::tools
