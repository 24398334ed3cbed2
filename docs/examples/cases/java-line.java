import java.util.HashMap;
import java.util.Map;

public class Inventory {
    private final Map<String, Integer> stock = new HashMap<>();

    public void add(String item, int quantity) {
        stock.merge(item, quantity, Integer::sum);
    }

    public int quantityOf(String item) {
        return stock.getOrDefault(‸);
    }
}
