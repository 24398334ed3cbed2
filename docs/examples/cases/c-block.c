#include <stdio.h>
#include <stdlib.h>

/* Reverse a singly linked list in place and return the new head. */
struct node {
    int value;
    struct node *next;
};

struct node *reverse(struct node *head) {
    struct node *prev = NULL;
    while (head != NULL) {
        ‸
    }
    return prev;
}

int main(void) {
    struct node c = {3, NULL}, b = {2, &c}, a = {1, &b};
    for (struct node *n = reverse(&a); n != NULL; n = n->next)
        printf("%d\n", n->value);
    return 0;
}
