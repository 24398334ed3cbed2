#include <algorithm>
#include <vector>

class Stack {
public:
    void push(int value) { items_.push_back(value); }

    int pop() {
        int top = items_.back();
        items_.‸
        return top;
    }

    bool empty() const { return items_.empty(); }

private:
    std::vector<int> items_;
};
