#include <string.h>

/* Count how many times the character c occurs in s. */
size_t count_char(const char *s, char c) {
    size_t n = 0;
    for (size_t i = 0; s[i] != '\0'; i++) {
        if (s[i] == ‸)
            n++;
    }
    return n;
}
