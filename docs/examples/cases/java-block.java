import java.util.ArrayList;
import java.util.List;

public class Fizz {
    /** The FizzBuzz words for 1..n. */
    public static List<String> fizzBuzz(int n) {
        List<String> out = new ArrayList<>();
        for (int i = 1; i <= n; i++) {
            ‸
        }
        return out;
    }

    public static void main(String[] args) {
        for (String word : fizzBuzz(15)) {
            System.out.println(word);
        }
    }
}
