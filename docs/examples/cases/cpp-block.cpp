#include <iostream>
#include <map>
#include <string>
#include <vector>

// Group words by their first letter.
std::map<char, std::vector<std::string>> group_by_initial(const std::vector<std::string>& words) {
    std::map<char, std::vector<std::string>> groups;
    for (const auto& word : words) {
        ‸
    }
    return groups;
}

int main() {
    auto groups = group_by_initial({"apple", "avocado", "banana", "cherry"});
    for (const auto& [initial, list] : groups) {
        std::cout << initial << ": " << list.size() << "\n";
    }
}
