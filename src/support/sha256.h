// SHA-256 of a file or bytes, as lowercase hex: how `kiln optimize` records which model a registered
// version was built from (FIPS 180-4; checked against sha256sum in the unit tests).
#pragma once

#include <string>
#include <string_view>

#include "kiln/status.h"

namespace kiln {

std::string sha256_hex(std::string_view bytes);
Expected<std::string> sha256_file(const std::string& path);  // errors name the file

}  // namespace kiln
